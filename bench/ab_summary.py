"""Medians per build of bench/ab.sh's JSON lines (argument: the file)."""
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
for what in ('push', 'local'):
    for b in ('before', 'after'):
        rs = [r for r in rows if r['what'] == what and r['build'] == b]
        if not rs: continue
        if what == 'push':
            g = [r['r']['ingest_gbps'] for r in rs]; c = [r['r']['server_cpu_s_per_gb'] for r in rs]
            print(f"bench push {b:6}: GB/s {', '.join(f'{x:.2f}' for x in g)} (median {st.median(g):.2f}); server CPU s/GB {', '.join(f'{x:.3f}' for x in c)} (median {st.median(c):.3f}); load {', '.join(str(r['load']) for r in rs)}")
        else:
            p = [r['r']['push_gbps'] for r in rs]; f = [r['r']['fetch_gbps'] for r in rs]
            c = [r['r']['push_cpu_s_per_gb']['servers'] for r in rs]; pk = [r['r']['server_peak_rss_bytes'] >> 20 for r in rs]
            v = all(r['r']['verified'] for r in rs); busy = [r['r']['busy_replies'] for r in rs]
            print(f"local 2G   {b:6}: push GB/s {', '.join(f'{x:.2f}' for x in p)} (median {st.median(p):.2f}); fetch {', '.join(f'{x:.2f}' for x in f)} (median {st.median(f):.2f}); servers push CPU s/GB median {st.median(c):.2f}; peak MiB {pk}; Busy {busy}; verified {v}; load {', '.join(str(r['load']) for r in rs)}")
