"""The proxy route: how a sandbox with no network reaches the model proxy and nothing else.

The proxy listens on a host Unix socket. Its folder is bind-mounted read-only into the
sandbox at ``/run/gyre`` (connecting needs no write access; read-only, the sandbox cannot
unlink or replace the socket that other episodes share), and a forwarder inside the sandbox listens on ``127.0.0.1:<port>`` and
relays each connection to that socket. The sandbox keeps no network interface but
loopback, so the socket is the only way out; an agent's base URL is
``http://127.0.0.1:<port>/...``. The proxy answers a sandbox only for its own episode's
session, with that episode's key (``gyre_env.proxy.auth``).
"""

from __future__ import annotations

import os

SOCKET_DIR_IN_SANDBOX = "/run/gyre"

# Runs inside the sandbox with its python3 (stdlib only). Threads relay bytes both ways.
FORWARDER = r"""
import socket, sys, threading, time
path, port = sys.argv[1], int(sys.argv[2])
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
def serve(client):
    for attempt in range(20):  # a proxy busy or restarting: retry for about 2 s
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
            break
        except OSError as e:
            upstream.close()
            if attempt == 19:
                print(f"cannot reach the proxy at {path}: {e}", file=sys.stderr, flush=True)
                client.close()
                return
            time.sleep(0.1)
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
    pipe(client, upstream)
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(128)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def socket_mount(host_socket: str) -> tuple[str, str]:
    """(host folder, sandbox folder) to bind, read-only, so the socket appears under
    /run/gyre."""
    return os.path.dirname(os.path.abspath(host_socket)), SOCKET_DIR_IN_SANDBOX


def start_command(host_socket: str, port: int, python: str = "python3") -> str:
    """Shell command that starts the forwarder in the background and waits until it listens."""
    from gyre_env.sandbox.shell import shell_quote

    inner = f"{SOCKET_DIR_IN_SANDBOX}/{os.path.basename(host_socket)}"
    return (
        f"{python} -c {shell_quote(FORWARDER)} {shell_quote(inner)} {port} "
        f"> /tmp/.gyre-forwarder.log 2>&1 & "
        f"for i in $(seq 100); do grep -q ready /tmp/.gyre-forwarder.log 2>/dev/null && exit 0; "
        f"sleep 0.05; done; cat /tmp/.gyre-forwarder.log >&2; exit 1"
    )
