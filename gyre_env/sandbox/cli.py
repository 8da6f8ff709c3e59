"""`gyre sandbox ...` and `gyre images ...` commands."""

from __future__ import annotations

import argparse
import json


def add_commands(sub) -> None:
    sandbox = sub.add_parser("sandbox", help="run commands in a sandbox; clean up leaked ones")
    ssub = sandbox.add_subparsers(dest="sandbox_command", required=True)

    gc = ssub.add_parser("gc", help="remove sandboxes whose owner process died or whose TTL passed")
    gc.add_argument("--dry-run", action="store_true", help="list what would be removed")
    gc.set_defaults(func=_gc)

    run = ssub.add_parser("run", help="start a sandbox, run a command in it, print the result")
    run.add_argument("cmd", help="bash command to run in the sandbox")
    run.add_argument("--sandbox", default="auto", help="docker | bwrap | local | auto")
    run.add_argument("--image", default="gyre-base:latest", help="Docker image")
    run.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before the command is killed"
    )
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.set_defaults(func=_run)

    from gyre_env.sandbox import images

    images.add_images_commands(sub)


def _gc(args: argparse.Namespace) -> int:
    from gyre_env.sandbox import bwrap

    removed = bwrap.reap(dry_run=args.dry_run)
    try:
        from gyre_env.sandbox import docker

        if docker.daemon_available():
            removed += docker.reap(dry_run=args.dry_run)
    except ImportError:
        pass
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} leaked sandbox(es)")
    for name in removed:
        print(f"  {name}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from gyre_env.sandbox import SandboxConfig, choose_backend, make_sandbox

    backend = choose_backend(args.sandbox)
    with make_sandbox(SandboxConfig(image=args.image), backend=backend) as sandbox:
        result = sandbox.exec(args.cmd, timeout=args.timeout)
    if args.json:
        print(json.dumps({"backend": backend, **result.__dict__}))
    else:
        print(f"[{backend}] exit {result.exit_code} in {result.duration_s * 1000:.1f} ms")
        print(result.output, end="" if result.output.endswith("\n") else "\n")
    return 0 if result.ok else 1
