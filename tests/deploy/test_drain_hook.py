"""The servers' preStop hook (deploy/helm/sluice/files/drain.sh) against a stand-in for the
admin HTTP API on 127.0.0.1, answering as the agreed contract says (POST /api/v1/drain starts a
drain, GET /readyz answers 503 while draining) or as a server without that API does."""

import http.server
import os
import subprocess
import threading
import time

import pytest

from conftest import CHART_SOURCE

HOOK = CHART_SOURCE / "files/drain.sh"
STOPS_AFTER_S = 1.5


class AdminApi:
    """A server whose answers are given per path; `stop_after_drain` closes the port this
    long after a drain request, as a drained server exits."""

    def __init__(self, answers: dict[tuple[str, str], int], stop_after_drain: float | None, reason=True):
        self.requests: list[tuple[str, str, str | None]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self):
                api.requests.append((self.command, self.path, self.headers.get("Authorization")))
                code = answers.get((self.command, self.path), 404)
                if reason:
                    self.send_response(code)
                else:  # "HTTP/1.1 503\r\n": the reason phrase is optional
                    self.wfile.write(f"HTTP/1.1 {code}\r\n".encode())
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()
                if self.path == "/api/v1/drain" and stop_after_drain is not None:
                    threading.Timer(stop_after_drain, api.stop).start()

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_hook(port: int, token: str | None) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_SERVER_ADMIN_TOKEN"}
    if token is not None:
        env["SLUICE_SERVER_ADMIN_TOKEN"] = token
    start = time.monotonic()
    result = subprocess.run(["bash", str(HOOK), str(port)], env=env, capture_output=True, text=True, timeout=30)
    return result, time.monotonic() - start


@pytest.fixture
def api(request):
    server = AdminApi(*request.param)
    yield server
    server.stop()


CONTRACT = ({("POST", "/api/v1/drain"): 202, ("GET", "/readyz"): 503}, STOPS_AFTER_S)
CONTRACT_NO_REASON = (*CONTRACT, False)


@pytest.mark.parametrize("api", [CONTRACT, CONTRACT_NO_REASON], indirect=True, ids=["reason", "no-reason"])
def test_drains_then_waits_for_the_server_to_stop(api):
    result, took = run_hook(api.port, "sluice-token")
    assert result.returncode == 0, result.stderr
    assert api.requests[:2] == [
        ("POST", "/api/v1/drain", "Bearer sluice-token"),
        ("GET", "/readyz", None),
    ]
    # It returned only once the port had closed (Kubernetes sends SIGTERM when it returns).
    assert took >= STOPS_AFTER_S, took
    assert "the server has stopped" in result.stderr


@pytest.mark.parametrize("api", [CONTRACT], indirect=True)
def test_no_token_no_authorization_header(api):
    result, _ = run_hook(api.port, None)
    assert result.returncode == 0, result.stderr
    assert api.requests[0] == ("POST", "/api/v1/drain", None)


@pytest.mark.parametrize("api", [({("POST", "/api/v1/drain"): 401}, None)], indirect=True)
def test_refused_drain_fails_at_once(api):
    result, took = run_hook(api.port, "wrong")
    assert result.returncode == 1
    assert "answered '401'" in result.stderr
    assert took < 5


# A server without the admin API answers every path like /metrics, with 200: the hook must not
# then wait for a drain that never started.
@pytest.mark.parametrize(
    "api", [({("POST", "/api/v1/drain"): 200, ("GET", "/readyz"): 200}, None)], indirect=True
)
def test_server_not_draining_fails_at_once(api):
    result, took = run_hook(api.port, "sluice-token")
    assert result.returncode == 1
    assert "GET /readyz answered '200'" in result.stderr
    assert took < 5


def test_nothing_listening_fails_at_once():
    api = AdminApi({}, None)
    api.stop()
    result, took = run_hook(api.port, None)
    assert result.returncode == 1
    assert "answered 'nothing'" in result.stderr
    assert took < 5
