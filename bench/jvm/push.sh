#!/usr/bin/env bash
# The JVM client's push path, two settings side by side (see bench/jvm/push.py).
#   SLUICE_BENCH_SKIP_BUILD=1 reuses the sluice binary and the compiled client.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [[ "${SLUICE_BENCH_SKIP_BUILD:-0}" != 1 ]]; then
  cargo build --release -p sluice
  (cd clients/jvm && mvn -q -B install -DskipTests -pl sluice-client -am \
    && mvn -q -B test-compile -pl sluice-client)
fi
CP_FILE="clients/jvm/sluice-client/target/bench.classpath"
(cd clients/jvm/sluice-client && mvn -q -B dependency:build-classpath \
  -Dmdep.outputFile=target/bench.classpath -Dmdep.includeScope=test)
CP="clients/jvm/sluice-client/target/classes:clients/jvm/sluice-client/target/test-classes:$(cat "$CP_FILE")"
exec python3 "bench/jvm/${SLUICE_JVM_BENCH_SCRIPT:-push.py}" --classpath "$CP" "$@"
