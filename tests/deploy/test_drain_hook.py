"""The servers' preStop hook (deploy/helm/sluice/files/drain.sh) against a stand-in for the
admin HTTP API on 127.0.0.1, answering as the agreed contract says (POST /api/v1/drain starts a
drain, GET /readyz answers 503 while draining, GET /api/v1/status tells the shuffles not committed yet) or as
a server without that API does."""

import http.server
import json
import os
import subprocess
import threading
import time

import pytest

from conftest import CHART_SOURCE

HOOK = CHART_SOURCE / "files/drain.sh"
EMPTY_AFTER_S = 1.5


class AdminApi:
    """Answers `codes[(method, path)]` (404 otherwise). With `shuffles`, GET /api/v1/status
    answers {"draining": true, "shuffles_held": 7, "uncommitted_shuffles": shuffles(seconds since
    the drain request)}: committed shuffles stay held, and the hook must not wait for them.
    `exit_after` closes the port that long after a drain request, as a server that stops by
    itself. `reason=False` sends status lines without a reason phrase."""

    def __init__(self, codes, shuffles=None, exit_after=None, reason=True):
        self.requests: list[tuple[str, str, str | None]] = []
        self.drained_at = None
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self):
                api.requests.append((self.command, self.path, self.headers.get("Authorization")))
                code, body = codes.get((self.command, self.path), 404), b""
                if self.path == "/api/v1/drain" and api.drained_at is None:
                    api.drained_at = time.monotonic()
                    if exit_after is not None:
                        threading.Timer(exit_after, api.stop).start()
                if self.path == "/api/v1/status" and shuffles and api.drained_at is not None:
                    held = shuffles(time.monotonic() - api.drained_at)
                    code, body = 200, json.dumps({"draining": True, "shuffles_held": 7,
                                                    "uncommitted_shuffles": held}).encode()
                if reason:
                    self.send_response(code)
                else:
                    self.wfile.write(f"HTTP/1.1 {code}\r\n".encode())
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.running = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        if self.running:
            self.running = False
            self.httpd.shutdown()
            self.httpd.server_close()


def run_hook(api: AdminApi, token: str | None, drain_seconds: int = 30):
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_SERVER_ADMIN_TOKEN"}
    if token is not None:
        env["SLUICE_SERVER_ADMIN_TOKEN"] = token
    start = time.monotonic()
    result = subprocess.run(
        ["bash", str(HOOK), str(api.port), str(drain_seconds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, time.monotonic() - start


DRAINS = {("POST", "/api/v1/drain"): 200, ("GET", "/readyz"): 503}


def empties(after_s):
    return lambda t: 10 if t < after_s else 0


@pytest.fixture
def stand_in():
    servers = []

    def make(*args, **kwargs):
        servers.append(AdminApi(*args, **kwargs))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


@pytest.mark.parametrize("reason", [True, False], ids=["reason", "no-reason"])
def test_waits_until_every_shuffle_is_committed(stand_in, reason):
    api = stand_in(DRAINS, shuffles=empties(EMPTY_AFTER_S), reason=reason)
    result, took = run_hook(api, "sluice-token")
    assert result.returncode == 0, result.stderr
    assert api.requests[:3] == [
        ("POST", "/api/v1/drain", "Bearer sluice-token"),
        ("GET", "/readyz", "Bearer sluice-token"),
        ("GET", "/api/v1/status", "Bearer sluice-token"),
    ]
    # It returned (and Kubernetes sends SIGTERM) only once nothing uncommitted was left.
    assert took >= EMPTY_AFTER_S, took
    assert "no uncommitted shuffle left" in result.stderr
    assert api.running


def test_waits_for_a_server_that_stops_by_itself(stand_in):
    api = stand_in({**DRAINS, ("POST", "/api/v1/drain"): 202}, exit_after=EMPTY_AFTER_S)
    result, took = run_hook(api, "sluice-token")
    assert result.returncode == 0, result.stderr
    assert took >= EMPTY_AFTER_S, took
    assert "the server has stopped" in result.stderr


def test_gives_up_after_the_drain_timeout(stand_in):
    api = stand_in(DRAINS, shuffles=lambda t: 3)
    result, took = run_hook(api, None, drain_seconds=2)
    assert result.returncode == 0, result.stderr
    assert 2 <= took < 10, took
    assert "2 s are up" in result.stderr


def test_no_token_no_authorization_header(stand_in):
    api = stand_in(DRAINS, shuffles=empties(0))
    result, _ = run_hook(api, None)
    assert result.returncode == 0, result.stderr
    assert {auth for _, _, auth in api.requests} == {None}


def test_refused_drain_fails_at_once(stand_in):
    api = stand_in({("POST", "/api/v1/drain"): 401})
    result, took = run_hook(api, "wrong")
    assert result.returncode == 1
    assert "answered '401'" in result.stderr
    assert took < 5


# A server without the admin API answers every path like /metrics, with 200: the hook must not
# then wait for a drain that never started.
def test_server_not_draining_fails_at_once(stand_in):
    api = stand_in({("POST", "/api/v1/drain"): 200, ("GET", "/readyz"): 200})
    result, took = run_hook(api, "sluice-token")
    assert result.returncode == 1
    assert "GET /readyz answered '200'" in result.stderr
    assert took < 5


def test_nothing_listening_fails_at_once(stand_in):
    api = stand_in({})
    api.stop()
    result, took = run_hook(api, None)
    assert result.returncode == 1
    assert "answered 'nothing'" in result.stderr
    assert took < 5
