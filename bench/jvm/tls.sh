#!/usr/bin/env bash
# The JVM client's TLS engines side by side, JDK against netty-tcnative's BoringSSL (see
# bench/jvm/tls.py); builds and runs as bench/jvm/push.sh does (SLUICE_BENCH_SKIP_BUILD=1 reuses
# the builds).
SLUICE_JVM_BENCH_SCRIPT=tls.py exec "$(dirname "${BASH_SOURCE[0]}")/push.sh" "$@"
