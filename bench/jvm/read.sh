#!/usr/bin/env bash
# The JVM reader against the Rust reader on the same committed shuffle (see bench/jvm/read.py);
# builds and runs as bench/jvm/push.sh does (SLUICE_BENCH_SKIP_BUILD=1 reuses the builds).
SLUICE_JVM_BENCH_SCRIPT=read.py exec "$(dirname "${BASH_SOURCE[0]}")/push.sh" "$@"
