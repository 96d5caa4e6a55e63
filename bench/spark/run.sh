#!/usr/bin/env bash
# Spark shuffle benchmark, built-in vs Sluice, on Spark 4.3 (see bench/spark/bench.py).
# Usage: bench/spark/run.sh [--runs 3] [--max-load 1.0] [--load-wait 300] [--json out.json]
#                           [--celeborn]
#   --celeborn adds Apache Celeborn (bench/celeborn/setup.sh; needs CELEBORN_HOME,
#   CELEBORN_CLIENT_JAR and SLUICE_SPARK_VENV=spark35: its client is for Spark 3).
#   SLUICE_SPARK_VENV=spark35 runs on Spark 3.5 instead of 4.3.
#   SLUICE_SPARK_SKIP_BUILD=1 reuses the existing sluice binary and plugin jars.
#   SLUICE_BENCH_QUERIES=order_by,repart runs only those queries.
#   SLUICE_BENCH_CONF="spark.k=v ..." adds Spark settings to every run (both modes).
#   SLUICE_BENCH_SLUICE_CONF="spark.sluice.k=v ..." adds plugin settings to the Sluice runs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

VENV="${SLUICE_SPARK_VENV:-spark4}"   # spark35: Spark 3.5 (the Celeborn runs, bench/celeborn)
tests/spark/setup.sh "$VENV"
if [[ "${SLUICE_SPARK_SKIP_BUILD:-0}" != 1 ]]; then
  cargo build --release -p sluice
  (cd clients/jvm && mvn -q -B install -DskipTests)
fi
export SPARK_LOCAL_IP=127.0.0.1
exec ".venv/$VENV/bin/python" "bench/spark/${SLUICE_SPARK_BENCH_SCRIPT:-bench.py}" "$@"
