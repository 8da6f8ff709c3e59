"""Ports, auth and records (issue 34, items 5 and 6): what listens where, who may call the
proxy, and that no episode's records are lost to eviction or injected by another episode.

Each test attacks one property. The sandbox tests run a hostile client inside real Docker
and bubblewrap sandboxes that hold the proxy socket, as a CLI agent's sandbox does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import socket
import threading
from pathlib import Path

import httpx
import pytest

from gyre_env.proxy.chat import RequestError
from gyre_env.proxy.records import JsonlSink, read_jsonl
from gyre_env.proxy.scripted import ScriptedEngine
from gyre_env.proxy.server import ProxyConfig, ProxyServer
from gyre_env.proxy.sessions import SessionStore

pytestmark = pytest.mark.timeout(180)

CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


# -- what listens where ------------------------------------------------------------------------
def _listeners(port: int) -> list[str]:
    """Local addresses listening on TCP ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        with open(f"/proc/net/{name}") as f:
            next(f)
            for line in f:
                local, state = line.split()[1], line.split()[3]
                addr, hex_port = local.split(":")
                if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(addr)
                # each 32-bit word is in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width // 2, 4))
                family = socket.AF_INET if width == 8 else socket.AF_INET6
                found.append(socket.inet_ntop(family, raw))
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _assert_only_loopback_one(port: int) -> None:
    assert _listeners(port) == ["127.0.0.1"], _listeners(port)
    assert _connects("127.0.0.1", port)
    # another loopback address of this machine: a wildcard listener would accept it
    assert not _connects("127.0.0.2", port)


def test_the_listener_check_sees_a_wildcard_listener():
    """The check the store tests use can fail: a socket on every interface is seen."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert _listeners(port) == ["0.0.0.0"]
        assert _connects("127.0.0.2", port)


def test_a_weight_sync_store_listens_only_on_the_address_it_is_given():
    pytest.importorskip("torch.distributed")
    from gyre_env.weightsync.base import open_store, store_get

    port = _free_port()
    store = open_store("127.0.0.1", port, serve=True, prefix="t", timeout_s=10, peer="test")
    _assert_only_loopback_one(port)
    client = open_store("127.0.0.1", port, serve=False, prefix="t", timeout_s=10, peer="test")
    store.set("version", "3")
    # the store still works through its socket (a blocking get: the set is the server's)
    assert client.get("version") == b"3"
    assert store_get(client, "version") == b"3"
    del client, store


def test_a_store_on_a_port_in_use_names_the_address():
    pytest.importorskip("torch.distributed")
    from gyre_env.weightsync.base import WeightSyncError, open_store

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(WeightSyncError, match=f"could not serve the store at 127.0.0.1:{port}"):
            open_store("127.0.0.1", port, serve=True, prefix="t", timeout_s=5, peer="test")


def test_the_training_group_rendezvous_listens_only_on_its_address():
    dist = pytest.importorskip("torch.distributed")
    from gyre_env.scheduler.core_cell import GroupConfig, join_group

    port = _free_port()
    join_group(GroupConfig(rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}"))
    try:
        assert dist.get_world_size() == 1
        _assert_only_loopback_one(port)
    finally:
        dist.destroy_process_group()


# -- the proxy's own port and auth -------------------------------------------------------------
def _engine(enc):
    return ScriptedEngine([enc("ok<|im_end|>")], context_length=4096)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.2", "example.org"])
def test_the_proxy_refuses_to_listen_beyond_loopback_without_a_token(tok, enc, host):
    with pytest.raises(ValueError, match="without an auth token.*--insecure"):
        ProxyServer(ProxyConfig(host=host), engines=[_engine(enc)], tokenizer=tok)
    # with a token, or told so, it may (constructed only: nothing is bound here)
    ProxyServer(ProxyConfig(host=host, auth_token="t"), engines=[_engine(enc)], tokenizer=tok)
    ProxyServer(ProxyConfig(host=host, insecure=True), engines=[_engine(enc)], tokenizer=tok)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_loopback_needs_no_token(tok, enc, host):
    ProxyServer(ProxyConfig(host=host), engines=[_engine(enc)], tokenizer=tok)


def test_proxy_serve_refuses_an_open_host_before_loading_a_model():
    import argparse

    from gyre_env.proxy import cli

    parser = argparse.ArgumentParser(prog="gyre")
    cli.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["proxy", "serve", "--host", "0.0.0.0", "--upstream", "http://x"])
    with pytest.raises(SystemExit, match="--auth-token-env.*--insecure"):
        args.func(args)


ROUTES = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/models", None),
    ("GET", "/s/x/v1/models", None),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/s/x/v1/chat/completions", CHAT),
    ("POST", "/s/x/v1/messages", CHAT),
    ("POST", "/v1/responses", {"model": "m", "input": "hi"}),
    ("POST", "/s/x/v1/responses", {"model": "m", "input": "hi"}),
    ("POST", "/s/x/v1/messages/count_tokens", CHAT),
    ("DELETE", "/s/x", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_with_a_token_every_route_wants_it(start_proxy, enc, method, path, body):
    proxy = start_proxy([_engine(enc)], auth_token="sekret")
    url = proxy.base_url + path
    for headers in ({}, {"authorization": "Bearer nope"}, {"x-api-key": "sekre"}):
        r = httpx.request(method, url, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert "API key" in r.text
    r = httpx.request(method, url, json=body, headers={"authorization": "Bearer sekret"})
    assert r.status_code == 200, r.text


def test_the_token_is_compared_in_constant_time(start_proxy, enc, monkeypatch):
    import hmac

    from gyre_env.proxy import auth

    compared, real = [], hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    proxy = start_proxy([_engine(enc)], auth_token="sekret")
    for path in ("/health", "/metrics", "/v1/models"):
        r = httpx.get(proxy.base_url + path, headers={"authorization": "Bearer sekreX"})
        assert r.status_code == 401
    assert (b"sekreX", b"sekret") in compared and len(compared) >= 3


# -- session keys ------------------------------------------------------------------------------
def test_a_session_with_a_key_answers_only_that_key(start_proxy, enc):
    proxy = start_proxy([_engine(enc)])
    key_a, key_b = proxy.bind_session("ep-a"), proxy.bind_session("ep-b")
    assert key_a != key_b and len(key_a) > 30 and proxy.bind_session("ep-a") == key_a
    url = proxy.openai_base_url("ep-b") + "/chat/completions"
    for key in (None, "gyre", key_a, "ep-b"):
        headers = {"authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(url, json=CHAT, headers=headers)
        assert r.status_code == 401 and "session 'ep-b'" in r.text, r.text
    assert httpx.post(url, json=CHAT, headers={"x-api-key": key_b}).status_code == 200
    # without a path the key names its session
    r = httpx.post(proxy.base_url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": key_a})
    assert r.status_code == 200
    assert [(r.session, r.call_index) for r in proxy.records()] == [("ep-b", 0), ("ep-a", 0)]
    proxy.release_session("ep-b")  # retired: the old key no longer names the session
    r = httpx.post(proxy.base_url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": key_b})
    assert r.status_code == 200 and proxy.records()[-1].session == key_b  # its own, nobody's


def _unix_client(path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://sandbox")


def test_the_sandbox_socket_serves_only_a_sessions_own_model_routes(tok, enc, tmp_path):
    sock = f"/tmp/gyre-test-{os.getpid()}-{threading.get_ident()}.sock"
    proxy = ProxyServer(
        ProxyConfig(sandbox_socket=sock),
        engines=[_engine(enc)],
        tokenizer=tok,
        sink=JsonlSink(tmp_path / "r.jsonl"),
    ).start()
    try:
        key_a = proxy.bind_session("a")
        proxy.bind_session("b")
        with _unix_client(sock) as c:
            bearer = {"authorization": f"Bearer {key_a}"}
            assert c.post("/s/a/v1/chat/completions", json=CHAT, headers=bearer).status_code == 200
            assert c.post("/v1/chat/completions", json=CHAT, headers=bearer).status_code == 200
            assert c.post("/s/b/v1/chat/completions", json=CHAT, headers=bearer).status_code == 401
            # a session without a key, or none at all: refused from a sandbox
            assert c.post("/s/c/v1/chat/completions", json=CHAT).status_code == 401
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 401
            assert (
                c.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": "c"}).status_code
                == 401
            )
            for method, path in (("GET", "/health"), ("GET", "/metrics"), ("DELETE", "/s/b")):
                assert c.request(method, path, headers=bearer).status_code == 403
        # the same requests over TCP (the host) are not held to that
        assert (
            httpx.post(proxy.openai_base_url("c") + "/chat/completions", json=CHAT).status_code
            == 200
        )
        assert httpx.get(proxy.base_url + "/health").status_code == 200
    finally:
        proxy.stop()
    assert not os.path.exists(sock)
    assert [r.session for r in read_jsonl(tmp_path / "r.jsonl")] == ["a", "a", "c"]


# -- sessions are never lost -------------------------------------------------------------------
def test_live_sessions_are_never_evicted():
    store = SessionStore(max_sessions=2)
    a, b = store.get("a"), store.get("b")
    a.next_call_index()
    with pytest.raises(RequestError, match="2 live sessions.*DELETE /s/<session>") as err:
        store.get("c")
    assert err.value.status == 503
    assert store.get("a") is a and store.get("b") is b  # nothing was dropped for it
    assert store.release("b") and not store.release("nope")
    c = store.get("c")  # the released one makes room
    assert len(store) == 2 and store.live() == 2 and store.get("a") is a
    assert a.next_call_index() == 1  # a's numbering went on
    store.release("a")
    assert store.get("a") is a and a.next_call_index() == 2  # a released session continues
    assert store.get("c") is c


def test_a_full_proxy_refuses_new_sessions_and_keeps_the_live_ones(start_proxy, enc):
    proxy = start_proxy([_engine(enc)], max_sessions=2)

    def call(session):
        return httpx.post(proxy.openai_base_url(session) + "/chat/completions", json=CHAT)

    assert call("s1").status_code == 200 and call("s2").status_code == 200
    r = call("s3")
    assert r.status_code == 503 and "max_sessions" in r.json()["error"]["message"]
    assert call("s1").status_code == 200  # s1 kept its session: call 1, not 0 again
    assert httpx.request("DELETE", proxy.base_url + "/s/s2").json()["released"] is True
    assert call("s3").status_code == 200 and call("s1").status_code == 200
    got = [(r.session, r.call_index) for r in proxy.records()]
    assert got == [("s1", 0), ("s2", 0), ("s1", 1), ("s3", 0), ("s1", 2)]


def test_a_finished_episode_releases_its_session(tok, enc, tmp_path):
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig

    cfg = ModelServiceConfig(records_path=str(tmp_path / "r.jsonl"))
    with ModelService(cfg, engines=[_engine(enc)], tokenizer=tok) as service:
        ep = service.endpoint("ep-1")
        assert ep.api_key == service.proxy.keys.key_of("ep-1")
        bearer = {"authorization": f"Bearer {ep.api_key}"}
        with _unix_client(service.route_socket) as sandbox:
            assert (
                sandbox.post("/s/ep-1/v1/chat/completions", json=CHAT, headers=bearer).status_code
                == 200
            )
            assert service.proxy.core.sessions.live() == 1
            service.release("ep-1")
            assert service.proxy.core.sessions.live() == 0
            # the finished episode's key is retired: its sandbox's straggler call is refused
            r = sandbox.post("/s/ep-1/v1/chat/completions", json=CHAT, headers=bearer)
            assert r.status_code == 401
        # a host-side straggler continues the session's numbering (its record is kept)
        r = httpx.post(ep.base_url + "/chat/completions", json=CHAT, headers=bearer)
        assert r.status_code == 200
    got = [(r.session, r.call_index) for r in read_jsonl(tmp_path / "r.jsonl")]
    assert got == [("ep-1", 0), ("ep-1", 1)]


# -- from inside a sandbox ---------------------------------------------------------------------
_SANDBOX_CONFTEST = Path(__file__).parents[1] / "sandbox" / "conftest.py"


def _docker_image() -> str:
    """``gyre-base:latest`` when built, else the sandbox tests' host-/usr development image."""
    override = os.environ.get("GYRE_TEST_IMAGE")
    if override:
        return override
    spec = importlib.util.spec_from_file_location("_gyre_sandbox_fixtures", _SANDBOX_CONFTEST)
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    if fixtures._image_exists(fixtures.BASE_IMAGE):
        return fixtures.BASE_IMAGE
    return fixtures.build_dev_image()


HOSTILE = r"""
import errno, json, os, socket, sys, urllib.error, urllib.request
port, key, own, sibling, host_ports = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
base = f"http://127.0.0.1:{port}"
chat = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "forged"}]}
def call(method, path, key=None, body=None):
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
out = {
    "own": call("POST", f"/s/{own}/v1/chat/completions", key, chat),
    "sibling with own key": call("POST", f"/s/{sibling}/v1/chat/completions", key, chat),
    "sibling without key": call("POST", f"/s/{sibling}/v1/chat/completions", None, chat),
    "sibling, guessed key": call("POST", f"/s/{sibling}/v1/chat/completions", "gyre", chat),
    "sibling by name as key": call("POST", "/v1/chat/completions", sibling, chat),
    "new session": call("POST", "/s/injected/v1/chat/completions", None, chat),
    "default session": call("POST", "/v1/chat/completions", None, chat),
    "delete sibling": call("DELETE", f"/s/{sibling}", key),
    "metrics": call("GET", "/metrics", key),
    "health": call("GET", "/health", key),
}
def attempt(name, fn):
    try:
        fn()
        out[name] = "DONE"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
attempt("unlink socket", lambda: os.unlink("/run/gyre/proxy.sock"))
attempt("rename socket", lambda: os.rename("/run/gyre/proxy.sock", "/run/gyre/old.sock"))
attempt("new file by the socket", lambda: open("/run/gyre/proxy2.sock", "w").close())
out["still own"] = call("POST", f"/s/{own}/v1/chat/completions", key, chat)
for target in host_ports:
    host, p = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(p)), timeout=2).close()
        out["connect " + target] = "CONNECTED"
    except OSError as e:
        out["connect " + target] = type(e).__name__
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("bwrap", marks=pytest.mark.bwrap),
    ],
)
def test_a_sandbox_reaches_only_its_own_session_and_no_host_port(backend, tok, enc, tmp_path):
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig
    from gyre_env.sandbox import SandboxConfig, make_sandbox

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    records = tmp_path / "records.jsonl"
    cfg = ModelServiceConfig(records_path=str(records))
    with ModelService(cfg, engines=[_engine(enc)], tokenizer=tok) as service:
        own, sibling = service.endpoint("bench.0"), service.endpoint("bench.1")
        fields = {"proxy_socket": service.route_socket, "proxy_port": 8765, "memory_mb": 512}
        if backend == "docker":
            fields["image"] = _docker_image()
        sandbox = make_sandbox(SandboxConfig(**fields), backend=backend)
        try:
            targets = [
                f"127.0.0.1:{listener.getsockname()[1]}",  # a host service on loopback
                f"127.0.0.1:{service.proxy.port}",  # the proxy's own TCP port
                "172.17.0.1:80",  # Docker's host address
            ]
            args = ["8765", own.api_key, "bench.0", "bench.1", *targets]
            cmd = f"python3 -c {shlex.quote(HOSTILE)} {shlex.join(args)}"
            result = sandbox.exec(cmd, timeout=120)
        finally:
            sandbox.close()
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["own"] == 200 and out["still own"] == 200, out
        for name in (
            "sibling with own key",
            "sibling without key",
            "sibling, guessed key",
            "sibling by name as key",
            "new session",
            "default session",
        ):
            assert out[name] == 401, (name, out)
        assert out["delete sibling"] == out["metrics"] == out["health"] == 403, out
        for name in ("unlink socket", "rename socket", "new file by the socket"):
            assert out[name] in ("EROFS", "EACCES", "EPERM"), (name, out)
        assert not [k for k, v in out.items() if v == "CONNECTED"], out
        with pytest.raises(BlockingIOError):
            listener.accept()
        # the sibling's session is untouched: its first call is its call 0
        headers = {"authorization": f"Bearer {sibling.api_key}"}
        r = httpx.post(sibling.base_url + "/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 200
        assert os.path.exists(service.route_socket)
    listener.close()
    got = [(r.session, r.call_index) for r in read_jsonl(records)]
    assert got == [("bench.0", 0), ("bench.0", 1), ("bench.1", 0)]
