#!/usr/bin/env bash
# What durable commit costs: `sluice local --bytes SIZE` with durable_commit off and on,
# alternating in one sitting (the servers read SLUICE_SERVER_DURABLE_COMMIT from the environment),
# ROUNDS times each; then medians of push GB/s, commit seconds (the client's CommitShuffle), the
# servers' time making commits durable, and fetch GB/s.
#   bench/durable.sh [BINARY] [ROUNDS] [SIZE]      (defaults: target/release/sluice, 3, 2G)
# This VM's timings move ±15 % between sittings: compare only runs of one sitting; the 1-minute
# load is printed with each run.
set -euo pipefail
BIN=$(readlink -f "${1:-target/release/sluice}")
ROUNDS=${2:-3}
SIZE=${3:-2G}
out=$(mktemp)
cd "$(mktemp -d)"
for i in $(seq 1 "$ROUNDS"); do
  for durable in false true; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    r=$(SLUICE_SERVER_DURABLE_COMMIT=$durable "$BIN" local --bytes "$SIZE" --json 2>/dev/null)
    echo "{\"round\":$i,\"durable\":$durable,\"load\":$load,\"r\":$r}" | tee -a "$out"
  done
done
python3 - "$out" "$SIZE" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for d in (False, True):
    rs = [r for r in rows if r["durable"] == d]
    m = lambda k: st.median(r["r"][k] for r in rs)
    ok = all(r["r"]["verified"] for r in rs)
    print(f"local {sys.argv[2]} durable_commit={str(d).lower():5}: push {m('push_gbps'):.2f} GB/s, "
          f"commit {m('commit_seconds'):.3f} s (durable part, summed over servers, "
          f"{m('commit_sync_seconds'):.3f} s), fetch {m('fetch_gbps'):.2f} GB/s; verified {ok}; "
          f"loads {[r['load'] for r in rs]}")
PY
