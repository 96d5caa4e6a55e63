"""Every deployment way keeps a server's data across restarts and stops it with a drain: no unit,
manifest or chart deletes the data directories at start (a restarted server serves its committed
shuffles again), and each gives SIGTERM's drain (drain_timeout_ms) the time it needs."""

import re
import tomllib

import yaml

from conftest import ROOT

DEPLOY = ROOT / "deploy"


def test_nothing_in_deploy_deletes_data_at_start():
    for f in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix != ".json"):
        text = f.read_text()
        assert not re.search(r"find\b[^\n]*-delete", text), f"{f} deletes files with find"
        assert "ExecStartPre" not in text or f.suffix != ".service", f"{f}: ExecStartPre"
        assert "--clean" not in re.sub(r"#.*", "", text), f"{f} starts servers with --clean"


def test_systemd_stop_waits_for_the_drain():
    unit = (DEPLOY / "systemd/sluice-server.service").read_text()
    config = tomllib.loads((DEPLOY / "systemd/server.toml").read_text())
    m = re.search(r"^TimeoutStopSec=(\d+)min$", unit, re.M)
    assert m, "TimeoutStopSec= in minutes"
    grace_ms = config["transport"]["shutdown_grace_ms"]
    assert int(m.group(1)) * 60_000 > config["drain_timeout_ms"] + grace_ms
    assert re.search(r"^KillSignal=SIGTERM$", unit, re.M)


def test_kubernetes_grace_period_covers_the_drain():
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes/server.yaml").read_text()))
    sts = next(d for d in docs if d and d.get("kind") == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert "initContainers" not in pod, "an init container (the old data wipe) is back"
    config = tomllib.loads((DEPLOY / "kubernetes/config/server.toml").read_text())
    grace_ms = config["transport"]["shutdown_grace_ms"]
    assert pod["terminationGracePeriodSeconds"] * 1000 > config["drain_timeout_ms"] + grace_ms


def test_coordinators_are_peers():
    for path in ("kubernetes/config/coordinator.toml", "systemd/coordinator.toml"):
        config = tomllib.loads((DEPLOY / path).read_text())
        assert config.get("peers"), f"{path}: no peers (assignments would live on one coordinator)"
