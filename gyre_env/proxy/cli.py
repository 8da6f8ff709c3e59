"""``gyre proxy serve``: run the proxy in the foreground.

Engines: ``embedded`` replicas of a local model folder (the built-in tiny model by
default), ``sglang`` servers attached by URL, or ``--upstream`` to forward to an OpenAI- or
Anthropic-compatible API. Secrets come from environment variables, never the command line.
Heavy imports happen inside the handler.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_commands(sub) -> None:
    proxy = sub.add_parser("proxy", help="the model proxy (OpenAI/Anthropic APIs, TITO records)")
    proxy_sub = proxy.add_subparsers(dest="proxy_command")
    serve = proxy_sub.add_parser("serve", help="serve the proxy in the foreground")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--model", default=None, help="local Hugging Face model folder (default: built-in tiny)"
    )
    serve.add_argument("--replicas", type=int, default=1, help="embedded engine replicas")
    serve.add_argument("--max-batch-size", type=int, default=16, help="embedded engine batch size")
    serve.add_argument(
        "--sglang-url",
        action="append",
        default=[],
        help="attach an SGLang server (repeat for several replicas); needs --model for the tokenizer",
    )
    serve.add_argument(
        "--upstream", default=None, help="forward to this API root instead (passthrough)"
    )
    serve.add_argument("--upstream-api", choices=["openai", "anthropic"], default="openai")
    serve.add_argument(
        "--upstream-key-env", default=None, help="environment variable holding the upstream key"
    )
    serve.add_argument(
        "--upstream-model", default=None, help="replace the model name sent upstream"
    )
    serve.add_argument("--records", default=None, help="append TITO records to this JSONL file")
    serve.add_argument(
        "--compact", action="store_true", help="write prompt suffixes only (see JsonlSink)"
    )
    serve.add_argument(
        "--auth-token-env",
        default=None,
        help="environment variable holding a token every request must carry (needed to "
        "listen beyond loopback)",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow --host beyond loopback without a token (anyone reaching the port can use it)",
    )
    serve.add_argument("--max-new-tokens-cap", type=int, default=None)
    serve.add_argument(
        "--wait-timeout", type=float, default=600.0, help="seconds a call waits for a replica"
    )
    serve.add_argument(
        "--verify-render", action="store_true", help="check suffix rendering against full renders"
    )
    serve.set_defaults(func=_serve)
    proxy.set_defaults(func=lambda args: proxy.print_help() or 2)


def _env(name: str | None, what: str) -> str | None:
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{what}: environment variable {name} is not set")
    return value


def check_port(host: str, port: int) -> None:
    """Refuse, by number, a ``host:port`` this process cannot listen on (another server
    holds it, or the address is not this machine's), before anything slow is loaded: else
    the model loads first and the bind fails after it with a raw ``Errno 98`` traceback.
    Binds the way the server will (``SO_REUSEADDR``), then lets go."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SystemExit(f"gyre proxy serve: --host {host!r} does not resolve: {e}") from e
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise SystemExit(
                    f"gyre proxy serve: port {port} on {host} is in use: pick another --port "
                    f"(or stop what listens there: `ss -ltnp 'sport = :{port}'` names it)"
                ) from e
            raise SystemExit(f"gyre proxy serve: cannot listen on {host}:{port}: {e}") from e


def _serve(args: argparse.Namespace) -> int:
    from gyre_env.proxy.server import ProxyConfig, ProxyServer, check_exposure

    check_port(args.host, args.port)  # before any model loads
    from gyre_env.trajectory.records import JsonlSink

    config = ProxyConfig(
        host=args.host,
        port=args.port,
        auth_token=_env(args.auth_token_env, "--auth-token-env"),
        insecure=args.insecure,
        max_new_tokens_cap=args.max_new_tokens_cap,
        wait_timeout_s=args.wait_timeout,
        verify_render=args.verify_render,
    )
    try:
        check_exposure(config)  # before any model loads
    except ValueError as e:
        raise SystemExit(f"gyre proxy serve: {e}") from e
    if args.insecure and not config.auth_token:
        print(
            f"warning: serving on {args.host} without a token (--insecure): anyone who reaches "
            "the port can use this proxy",
            file=sys.stderr,
        )
    sink = JsonlSink(args.records, compact=args.compact) if args.records else None
    if args.upstream:
        from gyre_env.proxy.passthrough import UpstreamConfig

        upstream = UpstreamConfig(
            base_url=args.upstream,
            api=args.upstream_api,
            api_key=_env(args.upstream_key_env, "--upstream-key-env"),
            model=args.upstream_model,
        )
        ProxyServer(config, upstream=upstream, sink=sink).serve()
        return 0
    from gyre_env.engines.tiny import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    if args.sglang_url:
        if args.model is None:
            raise SystemExit(
                "--sglang-url needs --model (the served model's folder, for its tokenizer)"
            )
        from gyre_env.engines.sglang import SGLangEngine

        engines = [SGLangEngine(url=u, name=f"sglang-{i}") for i, u in enumerate(args.sglang_url)]
    else:
        from gyre_env.engines.embedded import EmbeddedEngine

        engines = [
            EmbeddedEngine(
                model_path=args.model, name=f"embedded-{i}", max_batch_size=args.max_batch_size
            )
            for i in range(args.replicas)
        ]
    server = ProxyServer(config, engines=engines, tokenizer=tokenizer, sink=sink)
    server.serve(before=_start_engines(engines))
    return 0


def _start_engines(engines):
    async def start() -> None:
        for engine in engines:
            starter = getattr(engine, "start", None)
            if starter is not None:
                await starter()

    return start
