#!/usr/bin/env bash
# The whole Spark integration suite, as `make test` (or CI) runs it on a fresh machine:
# venvs, the sluice binary, the shaded plugin jars, then the whole suite on Spark 4.3 and on
# Spark 3.5, and the job suite (test_spark.py: every result against the built-in shuffle) on
# Spark 4.2, 4.1 and 4.0, which load the plugin under its 4.0-4.2 class name (4.0 also takes the
# shims for its older MapStatus and ExternalSorter signatures).
# Usage: tests/spark/run.sh [pytest args...]     SLUICE_SPARK_SKIP_BUILD=1 reuses existing builds.
# -rs: the reason of every skipped test in the summary (a test not run says so: "... NOT RUN").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

tests/spark/setup.sh
if [[ "${SLUICE_SPARK_SKIP_BUILD:-0}" != 1 ]]; then
  cargo build --release -p sluice
  (cd clients/jvm && mvn -q -B install -DskipTests)
fi

status=0
for venv in spark4 spark35; do
  echo "== Spark suite on .venv/$venv"
  ".venv/$venv/bin/python" -m pytest -p no:cacheprovider -rs tests/spark "$@" || status=$?
done
for venv in spark42 spark41 spark40; do
  echo "== Spark job suite on .venv/$venv"
  ".venv/$venv/bin/python" -m pytest -p no:cacheprovider -rs tests/spark/test_spark.py "$@" || status=$?
done
exit $status
