#!/usr/bin/env bash
# The whole Spark integration suite, as `make test` (or CI) runs it on a fresh machine:
# venvs, the sluice binary, the shaded plugin jars, then the suite on Spark 4.3 and on Spark 3.5.
# Usage: tests/spark/run.sh [pytest args...]     SLUICE_SPARK_SKIP_BUILD=1 reuses existing builds.
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
  ".venv/$venv/bin/python" -m pytest -p no:cacheprovider tests/spark "$@" || status=$?
done
exit $status
