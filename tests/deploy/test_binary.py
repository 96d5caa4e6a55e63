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


TLS_MOUNT = "/etc/sluice/tls"
TLS_NAME = "sluice.example.internal"  # tls.serverName in values-full.yaml


def local_config(render, name: str, tmp_path: Path) -> str:
    """The rendered TOML, its TLS files (the Secret's tls.crt, tls.key, ca.crt) made by `sluice
    dev-certs` into a local directory that stands in for the mount."""
    text = render.config(name)
    if TLS_MOUNT in text:
        made = subprocess.run(
            [str(BINARY), "dev-certs", "--dir", str(tmp_path / "pki"), "--names", f"127.0.0.1,{TLS_NAME}"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        mount = tmp_path / "tls"
        mount.mkdir(exist_ok=True)
        for src, dst in zip(made, ["ca.crt", "tls.crt", "tls.key"]):
            (mount / dst).write_bytes(Path(src).read_bytes())
        text = text.replace(TLS_MOUNT, str(mount))
    return text


def server_args(render, tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "server.toml").write_text(local_config(render, "server.toml", tmp_path))
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
    (tmp_path / "coordinator.toml").write_text(local_config(render, "coordinator.toml", tmp_path))
    env = {"SLUICE_COORDINATOR_ADMIN_TOKEN": TOKEN}
    if render.which == "default":
        env["SLUICE_COORDINATOR_TRANSPORT__SECRET"] = render.secret_value("sluice-secrets", "transport-secret")
    args = ["coordinator", "--config", "coordinator.toml", "--listen", "127.0.0.1:0"]
    run_checked(args, env, tmp_path)


def test_drain_hook_drains_the_server(render, tmp_path):
    """The preStop hook as the pod runs it (its command from the render): an idle server holds
    no shuffle, so the drain is over at the first status check. values-full.yaml runs TLS: the
    metrics port serves HTTPS only, and the hook asks through `sluice admin request` with the CA
    and the name the certificate is checked against."""
    hook = []
    command = render.container(render.server)["lifecycle"]["preStop"]["exec"]["command"]
    tls_args = command[4:]
    assert bool(tls_args) == (render.which == "full"), command

    def drain(output):
        port = re.search(r"^metrics on \S+:(\d+)$", output, re.M).group(1)
        env = {**os.environ, "SLUICE_SERVER_ADMIN_TOKEN": TOKEN,
               "PATH": f"{BINARY.parent}:{os.environ['PATH']}"}
        hook_path = str(CHART_SOURCE / "files/drain.sh")
        if tls_args:
            # The plain-HTTP hook gets no answer from an HTTPS port (the server closes on its
            # request, and bash may die of SIGPIPE writing it): it fails, draining nothing.
            plain = subprocess.run(["bash", hook_path, port, "30"], env=env,
                                   capture_output=True, text=True, timeout=60)
            assert plain.returncode != 0, plain.stderr
            assert "draining for at most" not in plain.stderr, plain.stderr
        started = time.monotonic()
        local = [a.replace(TLS_MOUNT, str(tmp_path / "tls")) for a in tls_args]
        result = subprocess.run(["bash", hook_path, port, "30", *local], env=env,
                                capture_output=True, text=True, timeout=60)
        hook.append((result, time.monotonic() - started))

    args = server_args(render, tmp_path, "--metrics-listen", "127.0.0.1:0")
    run_checked(args, server_env(render), tmp_path, drain)
    ((result, took),) = hook
    assert result.returncode == 0, result.stderr
    assert "no uncommitted shuffle left" in result.stderr
    assert took < 10, took
