"""The chart against the sluice binary: the rendered TOML files and a generated secret must let
it start (the check docs/operations.md asks for before rolling a config), and the preStop hook
must drain a real server. Addresses and directories are overridden by flags to local ones; the
rest comes from the chart."""

import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CHART_SOURCE, ROOT

BINARY = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))
TOKEN = "sluice-" + "a" * 40


def run(args: list[str], env: dict[str, str], cwd: Path, while_up=None) -> tuple[bool, str]:
    """Runs the binary until it has printed `listening on` and, with --metrics-listen,
    `metrics on` (True; `while_up(output)` is called then), or exits (False); then stops it."""
    proc = subprocess.Popen(
        [str(BINARY), *args],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
    )
    waiting = {"listening on", *(["metrics on"] if "--metrics-listen" in args else [])}
    output = []
    deadline = time.monotonic() + 20
    try:
        while waiting and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                output.append(line)
                waiting -= {w for w in waiting if line.startswith(w)}
            elif proc.poll() is not None:
                break
        if not waiting and while_up:
            while_up("".join(output))
        return not waiting, "".join(output)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module", autouse=True)
def binary():
    if not BINARY.exists():
        pytest.skip(f"{BINARY} not built (make build, or set SLUICE_BIN)")


def run_checked(args, env, cwd, while_up=None):
    ok, output = run(args, env, cwd, while_up)
    assert ok, output


def server_args(render, tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "server.toml").write_text(render.config("server.toml"))
    data = tmp_path / "data0"
    data.mkdir()
    return ["server", "--config", "server.toml", "--listen", "127.0.0.1:0", "--data-dir", str(data), *extra]


def server_env(render) -> dict[str, str]:
    env = {
        "SLUICE_SERVER_SERVER_ID": "sluice-server-0",
        "SLUICE_SERVER_ADVERTISE_HOST": "127.0.0.1",
        "SLUICE_SERVER_ADMIN_TOKEN": TOKEN,
    }
    if render.which == "default":
        # The generated secret, through the environment as the pod passes it.
        env["SLUICE_SERVER_TRANSPORT__SECRET"] = render.secret_value("sluice-secrets", "transport-secret")
    return env


def test_server_starts_with_rendered_config(render, tmp_path):
    run_checked(server_args(render, tmp_path), server_env(render), tmp_path)


def test_coordinator_starts_with_rendered_config(render, tmp_path):
    (tmp_path / "coordinator.toml").write_text(render.config("coordinator.toml"))
    env = {"SLUICE_COORDINATOR_ADMIN_TOKEN": TOKEN}
    if render.which == "default":
        env["SLUICE_COORDINATOR_TRANSPORT__SECRET"] = render.secret_value("sluice-secrets", "transport-secret")
    args = ["coordinator", "--config", "coordinator.toml", "--listen", "127.0.0.1:0"]
    run_checked(args, env, tmp_path)


def test_drain_hook_drains_the_server(default, tmp_path):
    """The preStop hook as the pod runs it: an idle server holds no shuffle, so the drain is over
    at the first status check."""
    hook = []

    def drain(output):
        port = re.search(r"^metrics on \S+:(\d+)$", output, re.M).group(1)
        started = time.monotonic()
        result = subprocess.run(
            ["bash", str(CHART_SOURCE / "files/drain.sh"), port, "30"],
            env={**os.environ, "SLUICE_SERVER_ADMIN_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=60,
        )
        hook.append((result, time.monotonic() - started))

    args = server_args(default, tmp_path, "--metrics-listen", "127.0.0.1:0")
    run_checked(args, server_env(default), tmp_path, drain)
    ((result, took),) = hook
    assert result.returncode == 0, result.stderr
    assert "no uncommitted shuffle left" in result.stderr
    assert took < 10, took
