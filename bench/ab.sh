#!/usr/bin/env bash
# Two builds of sluice side by side, alternating in one sitting: `bench push --bytes 2G` and
# `local --bytes 2G`, ROUNDS times each, then medians per build.
#   bench/ab.sh BEFORE_BINARY AFTER_BINARY [ROUNDS]     (e.g. a worktree's target/release/sluice)
# One JSON line per run goes to stdout's first part (build, round, 1-minute load, the run's own
# JSON); bench/ab_summary.py prints the table. This VM's timings move ±15 % between sittings:
# compare only runs of one sitting, and state the load.
set -euo pipefail
A=${1:?usage: bench/ab.sh BEFORE AFTER [ROUNDS]}; B=${2:?usage: bench/ab.sh BEFORE AFTER [ROUNDS]}
ROUNDS=${3:-3}
here=$(dirname "$(readlink -f "$0")")
A=$(readlink -f "$A"); B=$(readlink -f "$B")
out=$(mktemp)
cd "$(mktemp -d)"
for i in $(seq 1 "$ROUNDS"); do
  for what in push local; do
    for tag in before after; do
      bin=$A; [ "$tag" = after ] && bin=$B
      load=$(cut -d' ' -f1 /proc/loadavg)
      if [ "$what" = push ]; then r=$("$bin" bench push --bytes 2G --json 2>/dev/null)
      else r=$("$bin" local --bytes 2G --json 2>/dev/null); fi
      echo "{\"round\":$i,\"build\":\"$tag\",\"what\":\"$what\",\"load\":$load,\"r\":$r}" | tee -a "$out"
    done
  done
done
python3 "$here/ab_summary.py" "$out"
