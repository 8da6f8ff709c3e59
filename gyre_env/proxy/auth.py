"""Who may call the proxy: its operator token and the per-episode session keys.

Two kinds of secret, both compared in constant time (:func:`hmac.compare_digest`):

- the proxy's ``auth_token`` (``ProxyConfig.auth_token``): the operator's. With it set,
  every route, ``/health``, ``/metrics`` and ``DELETE /s/<session>`` included, answers only
  a request that carries it (or a session key, on that session's routes).
- a session key (:meth:`SessionKeys.bind`): minted per episode by the model service and
  handed to that episode's agent as its API key. A session with a key answers only
  requests carrying that key (or the operator token), so a sandbox holding one episode's key
  cannot post into a sibling episode, whose name is easy to guess but whose key is not.

Requests that arrive on the sandbox socket (``ProxyConfig.sandbox_socket``) are held to
more: they must name a session that has a key, carry exactly that key, and reach only the
model routes (never ``/health``, ``/metrics`` or ``DELETE``).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading

from gyre_env.proxy.chat import RequestError


def same_secret(given: str, expected: str) -> bool:
    """``given == expected`` in time that does not depend on where they differ."""
    return hmac.compare_digest(given.encode(), expected.encode())


def presented_key(headers) -> str:
    """The API key a request carries: ``x-api-key``, else ``Authorization: Bearer``."""
    key = headers.get("x-api-key") or ""
    auth = headers.get("authorization") or ""
    if not key and auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    return key


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a port on this machine (``localhost``, 127.0.0.0/8,
    ``::1``). Other names and the wildcard addresses (``""``, ``0.0.0.0``, ``::``) do not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class SessionKeys:
    """Per-session keys (thread-safe): ``bind`` mints one, ``unbind`` retires it."""

    def __init__(self):
        self._by_session: dict[str, str] = {}
        self._by_key: dict[str, str] = {}
        self._lock = threading.Lock()

    def bind(self, session: str) -> str:
        """The session's key, minted on first call (unguessable: 192 random bits)."""
        with self._lock:
            key = self._by_session.get(session)
            if key is None:
                key = f"gyre-{secrets.token_urlsafe(24)}"
                self._by_session[session] = key
                self._by_key[key] = session
            return key

    def unbind(self, session: str) -> None:
        """Retire the session's key: a finished episode's calls are refused from now on."""
        with self._lock:
            key = self._by_session.pop(session, None)
            if key is not None:
                self._by_key.pop(key, None)

    def key_of(self, session: str) -> str | None:
        with self._lock:
            return self._by_session.get(session)

    def session_of(self, key: str) -> str | None:
        """The session whose key ``key`` is (None: no session's)."""
        with self._lock:
            session = self._by_key.get(key)
            expected = self._by_session.get(session) if session is not None else None
        # the dict lookup found it by hash; confirm in constant time all the same
        return session if expected is not None and same_secret(key, expected) else None


def check_operator(token: str | None, headers, *, sandbox: bool) -> None:
    """Raise 401 unless the request may use the proxy's service routes (``/health``,
    ``/metrics``, ``DELETE``): never from the sandbox socket; with a token, only with it."""
    if sandbox:
        raise RequestError("this route is not served to sandboxes", status=403)
    if token and not same_secret(presented_key(headers), token):
        raise RequestError("invalid or missing API key (the proxy's auth token)", status=401)


def authorize(
    token: str | None,
    keys: SessionKeys,
    headers,
    path_session: str | None,
    *,
    sessions_by_api_key: bool,
    sandbox: bool,
) -> str | None:
    """The session a model request may use (None: the default one), or raise 401.

    - From the sandbox socket: the ``/s/<session>`` (or key's) session must have a key and
      the request must carry it.
    - A session with a key: its key or the operator token.
    - Otherwise, with a token: the token as the key, or ``<token>:<session>``.
    - Otherwise (no token: a loopback-only proxy): anyone; the key names the session when
      ``sessions_by_api_key`` and there is no path session.
    """
    key = presented_key(headers)
    if path_session is None:
        bound = keys.session_of(key) if key else None
        if bound is not None:
            return bound
    if sandbox:
        expected = keys.key_of(path_session) if path_session is not None else None
        if expected is None or not same_secret(key, expected):
            raise RequestError(
                "a sandbox may call only its own episode's session, with that episode's API "
                "key (the OPENAI_API_KEY / ANTHROPIC_API_KEY it was given)",
                status=401,
            )
        return path_session
    if path_session is not None:
        expected = keys.key_of(path_session)
        if expected is not None:
            if same_secret(key, expected) or (token and same_secret(key, token)):
                return path_session
            raise RequestError(
                f"invalid or missing API key for session {path_session[:40]!r}", status=401
            )
    if token:
        n = len(token)
        if len(key) > n + 1 and key[n] == ":" and same_secret(key[:n], token):
            return path_session or key[n + 1 :]
        if not same_secret(key, token):
            raise RequestError("invalid or missing API key", status=401)
        return path_session
    if path_session is None and sessions_by_api_key and key:
        return key
    return path_session
