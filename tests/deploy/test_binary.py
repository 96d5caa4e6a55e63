"""The rendered TOML files and secrets, as the sluice binary reads them: it must start with each
(the check docs/operations.md asks for before rolling a config). Addresses and directories are
overridden by flags to local ones; the rest comes from the chart."""

import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT

BINARY = Path(os.environ.get("SLUICE_BIN", ROOT / "target/release/sluice"))


def start(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[bool, str]:
    """Runs the binary until it prints `listening on` (True) or exits (False), then stops it."""
    proc = subprocess.Popen(
        [str(BINARY), *args],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    output = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                output.append(line)
                if line.startswith("listening on"):
                    return True, "".join(output)
            elif proc.poll() is not None:
                break
        return False, "".join(output)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module", autouse=True)
def binary():
    if not BINARY.exists():
        pytest.skip(f"{BINARY} not built (make build, or set SLUICE_BIN)")


def run_checked(args, env, tmp_path):
    ok, output = start(args, env, tmp_path)
    if not ok and "unknown field `admin_token`" in output:
        # The rest must still be right: run again without the token before saying why.
        ok, output = start(args, {k: v for k, v in env.items() if not k.endswith("ADMIN_TOKEN")}, tmp_path)
        assert ok, output
        pytest.xfail("this binary has no admin API yet (no admin_token key): the chart needs it")
    assert ok, output


def test_server_starts_with_rendered_config(render, tmp_path):
    (tmp_path / "server.toml").write_text(render.config("server.toml"))
    env = {
        "SLUICE_SERVER_SERVER_ID": "sluice-server-0",
        "SLUICE_SERVER_ADVERTISE_HOST": "127.0.0.1",
        "SLUICE_SERVER_ADMIN_TOKEN": "sluice-" + "a" * 40,
    }
    if render.which == "default":
        # The generated secret, through the environment as the pod passes it.
        env["SLUICE_SERVER_TRANSPORT__SECRET"] = render.secret_value("sluice-secrets", "transport-secret")
    data = tmp_path / "data0"
    data.mkdir()
    args = ["server", "--config", "server.toml", "--listen", "127.0.0.1:0", "--data-dir", str(data)]
    run_checked(args, env, tmp_path)


def test_coordinator_starts_with_rendered_config(render, tmp_path):
    (tmp_path / "coordinator.toml").write_text(render.config("coordinator.toml"))
    env = {"SLUICE_COORDINATOR_ADMIN_TOKEN": "sluice-" + "a" * 40}
    args = ["coordinator", "--config", "coordinator.toml", "--listen", "127.0.0.1:0"]
    run_checked(args, env, tmp_path)
