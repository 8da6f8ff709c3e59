"""The proxy route: a sandbox with no network reaches one host Unix socket, and nothing else.

The "proxy" here is a small HTTP server on a host Unix socket, standing in for Gyre's
model proxy (built later); the forwarder inside the sandbox and the mounts are real.
"""

from __future__ import annotations

import http.server
import json
import shlex
import shutil
import socket
import socketserver
import tempfile
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._reply(f"hello {self.path}".encode())

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._reply(body[::-1])

    def _reply(self, body: bytes) -> None:
        self.server.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # AF_UNIX has no client address to log
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def unix_http_server():
    folder = tempfile.mkdtemp(prefix="gyre-proxy-")  # short: AF_UNIX paths are <108 bytes
    path = str(Path(folder) / "proxy.sock")
    server = _UnixHTTPServer(path, _Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, path
    server.shutdown()
    server.server_close()
    shutil.rmtree(folder, ignore_errors=True)


_CLIENT = r"""
import json, socket, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
port, blocked = int(sys.argv[1]), sys.argv[2:]
base = f"http://127.0.0.1:{port}"
out = {"get": urllib.request.urlopen(base + "/v1/models", timeout=10).read().decode()}
body = bytes(range(256)) * 400
req = urllib.request.Request(base + "/v1/echo", data=body, method="POST")
out["post_ok"] = urllib.request.urlopen(req, timeout=10).read() == body[::-1]
with ThreadPoolExecutor(8) as pool:
    out["parallel"] = list(pool.map(
        lambda i: urllib.request.urlopen(f"{base}/p/{i}", timeout=10).read().decode(), range(8)))
out["blocked"] = {}
for target in blocked:
    host, p = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(p)), timeout=2).close()
        out["blocked"][target] = "CONNECTED"
    except OSError as e:
        out["blocked"][target] = type(e).__name__
print(json.dumps(out))
"""


def test_the_proxy_socket_is_reachable_and_nothing_else(make, isolated_backend, unix_http_server):
    server, sock_path = unix_http_server
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    host_port = listener.getsockname()[1]
    try:
        sandbox = make(isolated_backend, proxy_socket=sock_path, proxy_port=8765)
        blocked = [f"127.0.0.1:{host_port}", "172.17.0.1:80", "1.1.1.1:80"]
        cmd = f"python3 -c {shlex.quote(_CLIENT)} 8765 {' '.join(blocked)}"
        result = sandbox.exec(cmd, timeout=60)
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["get"] == "hello /v1/models"
        assert out["post_ok"]
        assert out["parallel"] == [f"hello /p/{i}" for i in range(8)]
        assert not [t for t, how in out["blocked"].items() if how == "CONNECTED"], out["blocked"]
        with pytest.raises(BlockingIOError):
            listener.accept()
        assert {"/v1/models", "/v1/echo"} <= set(server.seen)
    finally:
        listener.close()


def test_without_a_proxy_socket_nothing_listens_on_the_proxy_port(make, isolated_backend):
    sandbox = make(isolated_backend)
    probe = "import socket; socket.create_connection(('127.0.0.1', 8765), timeout=2)"
    result = sandbox.exec(f"python3 -c {shlex.quote(probe)}")
    assert result.exit_code != 0 and "ConnectionRefusedError" in result.stderr


def test_a_missing_proxy_socket_makes_requests_fail_not_hang(make, isolated_backend):
    """The proxy may start after the sandbox: the forwarder starts without the socket, and
    a request made while the socket is absent fails at once instead of hanging."""
    folder = tempfile.mkdtemp(prefix="gyre-proxy-")
    try:
        sandbox = make(isolated_backend, proxy_socket=f"{folder}/absent.sock")
        probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/', timeout=5)"
        result = sandbox.exec(f"python3 -c {shlex.quote(probe)}", timeout=30)
        assert result.exit_code != 0 and not result.timed_out, result
    finally:
        shutil.rmtree(folder, ignore_errors=True)
