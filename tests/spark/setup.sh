#!/usr/bin/env bash
# Creates the project-local virtualenvs the Spark integration tests use:
#   .venv/spark4   newest pyspark 4.x (pinned below) + pytest
#   .venv/spark35  pyspark 3.5.x + pytest
#   .venv/spark42  pyspark 4.2.x + pytest (the Spark 4.0-4.2 shuffle-manager class)
#   .venv/spark41  pyspark 4.1.x + pytest (the same class)
#   .venv/spark40  pyspark 4.0.x + pytest (the same class; Spark 4.0's MapStatus and ExternalSorter)
# Idempotent and cache-friendly: a venv whose pinned packages are already installed is left alone
# (checked with a stamp file holding the requirement line), so a second run takes well under a second.
# Usage: tests/spark/setup.sh [spark4|spark35|spark42|spark41|spark40 ...]   (default: all five)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"

# Pinned versions: bump deliberately (the per-version Maven modules compile against matching jars).
PYSPARK4_VERSION="${PYSPARK4_VERSION:-4.3.0}"
PYSPARK35_VERSION="${PYSPARK35_VERSION:-3.5.9}"
PYSPARK42_VERSION="${PYSPARK42_VERSION:-4.2.1}"
PYSPARK41_VERSION="${PYSPARK41_VERSION:-4.1.4}"
PYSPARK40_VERSION="${PYSPARK40_VERSION:-4.0.5}"
PYTEST_VERSION="${PYTEST_VERSION:-8.3.5}"

make_venv() {
  local name="$1" requirements="$2"
  local venv="$ROOT/.venv/$name"
  local stamp="$venv/.sluice-requirements"
  if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$requirements" ]]; then
    echo "setup.sh: $name up to date ($requirements)"
    return 0
  fi
  local start=$SECONDS
  echo "setup.sh: creating $venv ($requirements)"
  "$PYTHON" -m venv "$venv"
  # pip's own cache (~/.cache/pip) makes a re-creation after `rm -rf .venv` fast.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $requirements
  echo "$requirements" >"$stamp"
  echo "setup.sh: $name ready in $((SECONDS - start)) s"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(spark4 spark35 spark42 spark41 spark40)
for t in "${targets[@]}"; do
  case "$t" in
    spark4) make_venv spark4 "pyspark==$PYSPARK4_VERSION pytest==$PYTEST_VERSION" ;;
    spark35) make_venv spark35 "pyspark==$PYSPARK35_VERSION pytest==$PYTEST_VERSION" ;;
    spark42) make_venv spark42 "pyspark==$PYSPARK42_VERSION pytest==$PYTEST_VERSION" ;;
    spark41) make_venv spark41 "pyspark==$PYSPARK41_VERSION pytest==$PYTEST_VERSION" ;;
    spark40) make_venv spark40 "pyspark==$PYSPARK40_VERSION pytest==$PYTEST_VERSION" ;;
    *) echo "setup.sh: unknown target $t (spark4|spark35|spark42|spark41|spark40)" >&2; exit 2 ;;
  esac
done
