#!/usr/bin/env bash
# Spark at scale, built-in vs Sluice (vs Celeborn with --celeborn), on Spark 4.3 (see
# bench/spark/scale.py); set up and built as bench/spark/run.sh does (SLUICE_SPARK_SKIP_BUILD=1
# reuses the sluice binary and plugin jars).
SLUICE_SPARK_BENCH_SCRIPT=scale.py exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" "$@"
