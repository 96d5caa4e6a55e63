#!/usr/bin/env bash
# What durable commit costs: `sluice local --bytes SIZE` in three server configurations,
# alternating in one sitting (the servers read SLUICE_SERVER_* from the environment), ROUNDS
# times each; then medians of push GB/s, commit seconds (the client's CommitShuffle), the
# servers' time making commits durable, and fetch GB/s.
#   off        durable_commit = false (no sync, no record: a restart loses everything)
#   at-commit  durable_commit = true, flush_writeback = false (the commit syncs every byte)
#   default    durable_commit = true, flush_writeback = true (flushes start their writeback)
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
  for variant in off at-commit default; do
    case $variant in
      off) env=(SLUICE_SERVER_DURABLE_COMMIT=false) ;;
      at-commit) env=(SLUICE_SERVER_DURABLE_COMMIT=true SLUICE_SERVER_FLUSH_WRITEBACK=false) ;;
      default) env=(SLUICE_SERVER_DURABLE_COMMIT=true SLUICE_SERVER_FLUSH_WRITEBACK=true) ;;
    esac
    load=$(cut -d' ' -f1 /proc/loadavg)
    r=$(env "${env[@]}" "$BIN" local --bytes "$SIZE" --json 2>/dev/null)
    echo "{\"round\":$i,\"variant\":\"$variant\",\"load\":$load,\"r\":$r}" | tee -a "$out"
  done
done
python3 - "$out" "$SIZE" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for v in ("off", "at-commit", "default"):
    rs = [r for r in rows if r["variant"] == v]
    m = lambda k: st.median(r["r"][k] for r in rs)
    ok = all(r["r"]["verified"] for r in rs)
    print(f"local {sys.argv[2]} {v:9}: push {m('push_gbps'):.2f} GB/s, commit "
          f"{m('commit_seconds'):.3f} s (making it durable, summed over the servers: "
          f"{m('commit_sync_seconds'):.3f} s), fetch {m('fetch_gbps'):.2f} GB/s; verified {ok}; "
          f"loads {[r['load'] for r in rs]}")
PY
