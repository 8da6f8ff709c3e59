"""The NL2Repo tools: JSON schemas and their execution against a sandbox.

Every tool returns a ``ToolOutput``: text for the agent plus whether the call worked. A
mistake the agent can fix (a missing file, a path outside the workspace, an ambiguous
edit) is an ``ok=False`` output, never an exception. Only a sandbox that died raises.

Handlers return their whole output; the env cuts each observation once, with ``clip``, to
``max_output_chars`` (default ``DEFAULT_MAX_OUTPUT_CHARS``), and the marker that stands
where it cut tells the model the limit. The tool schemas do not repeat it: a prompt that
never meets the limit is the same as before there was one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre_env.sandbox import PathOutsideWorkspaceError, SandboxError
from gyre_env.sandbox.base import DEFAULT_OUTPUT_LIMIT
from gyre_env.sandbox.shell import shell_quote

DEFAULT_MAX_OUTPUT_CHARS = 30_000
"""The one limit on what a tool call shows the model: an observation longer than this many
characters keeps its head and tail around a marker saying how much was cut (``clip``).
The default of ``NL2RepoConfig.max_output_chars``; the sandbox's byte cap is raised to fit
it (``sandbox_output_limit``) and the observation space is sized from it."""

MIN_OUTPUT_CHARS = 1000
"""The smallest ``max_output_chars``: room for the marker and some head and tail."""

_PATH_EXAMPLES = ["main.py", "pkg/__init__.py", "notes.txt", "tests/test_main.py"]

TOOLS: list[dict] = [
    {
        "name": "bash",
        "description": "Run a bash command in the workspace (no network). Returns its output "
        "and exit code. State such as `cd` does not persist between calls, and processes "
        "it leaves running are killed when it ends.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The command line.",
                    "examples": ["ls", "echo hello", "find . -name '*.py' | sort", "true"],
                },
                "timeout": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 3600,
                    "description": "Seconds before the command is killed (capped by the env).",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "name": "read_file",
        "description": "Read a text file of the workspace, optionally a range of lines (1-based).",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "examples": _PATH_EXAMPLES},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file (parent folders are created).",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "examples": _PATH_EXAMPLES},
                "content": {"type": "string"},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
    {
        "name": "str_replace",
        "description": "Replace an exact snippet of a file. `old_str` must occur exactly once "
        "unless `replace_all` is true.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "examples": _PATH_EXAMPLES},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
                "replace_all": {"type": "boolean"},
            },
            "required": ["path", "old_str", "new_str"],
            "additionalProperties": False,
        },
    },
    {
        "name": "list_dir",
        "description": "List files and folders under a workspace folder (folders end in /).",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "examples": [".", "pkg", "tests"]},
                "depth": {"type": "integer", "minimum": 1, "maximum": 10},
            },
            "additionalProperties": False,
        },
    },
    {
        "name": "run_tests",
        "description": "Run the task's visible tests (if it has any) and summarise the results.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
    {
        "name": "submit",
        "description": "Finish: the workspace is graded by hidden tests and the episode ends.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
]


def select_tools(names: list[str] | None) -> list[dict]:
    """The schemas of the tools ``names`` (in ``TOOLS`` order); None: all of them."""
    if names is None:
        return list(TOOLS)
    known = [t["name"] for t in TOOLS]
    if isinstance(names, str) or not names:
        raise ValueError(f"tools must be a non-empty list of tool names from {known}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown tools {unknown}; known tools: {known}")
    return [t for t in TOOLS if t["name"] in names]


MUTATING_TOOLS = frozenset({"bash", "write_file", "str_replace"})
"""Tools after which the workspace may have changed (Φ is recomputed only after these)."""


@dataclass
class ToolOutput:
    """What a tool call produced, before the env cuts it to its limit (``clip``)."""

    text: str
    ok: bool = True
    visible: object = None
    """The ``VisibleRun`` behind a ``run_tests`` output (reused for Φ)."""
    omitted: int = 0
    """Characters the sandbox already dropped from the middle of ``text`` (its memory cap,
    always inside what ``clip`` cuts): counted in the marker."""


def truncation_marker(omitted: int, total: int, limit: int) -> str:
    """The line that stands where ``clip`` cut characters out of a tool output."""
    return f"[output truncated: {omitted:,} of {total:,} characters omitted; limit {limit:,}]"


def clip(text: str, limit: int, omitted: int = 0) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around a marker
    line, all within ``limit``. The only place a tool output is cut.

    ``omitted`` counts characters already dropped from the middle of ``text`` (by the
    sandbox's memory cap, which keeps more than ``limit`` characters at each end, so that
    gap is always inside the cut): the marker states the whole output's length and how
    much of it is not shown.
    """
    if len(text) <= limit and not omitted:
        return text
    total = len(text) + omitted
    # The marker's length depends on the count it states; size the kept part for the
    # longest count (the whole output), then state the true one (never longer).
    room = max(limit - len(truncation_marker(total, total, limit)) - 2, 0)
    head = min(room - room // 2, len(text))
    tail = min(room // 2, len(text) - head)  # (no overlap, should the sandbox's gap be all)
    marker = truncation_marker(total - head - tail, total, limit)
    return f"{text[:head]}\n{marker}\n{text[len(text) - tail :] if tail else ''}"


def sandbox_output_limit(max_output_chars: int) -> int:
    """The sandbox byte cap (``SandboxConfig.output_limit``) that keeps at least
    ``max_output_chars`` characters at each end of a stream (a character is at most four
    bytes), so the sandbox never drops what ``clip`` would show."""
    return max(DEFAULT_OUTPUT_LIMIT, 8 * max_output_chars + 64)


def _fail(text: str) -> ToolOutput:
    return ToolOutput(f"Error: {text}", ok=False)


def _file_errors(call):
    """Turn the sandbox's file-API errors into agent-readable outputs (dead sandbox: raise)."""

    def wrapped(sandbox, args, limits):
        try:
            return call(sandbox, args, limits)
        except PathOutsideWorkspaceError:
            return _fail(f"path {args.get('path')!r} is outside the workspace")
        except FileNotFoundError:
            return _fail(f"no such file: {args.get('path')!r}")
        except IsADirectoryError:
            return _fail(f"{args.get('path')!r} is a directory")
        except ValueError as e:
            return _fail(str(e))
        except SandboxError as e:
            if sandbox.alive():
                return _fail(str(e))
            raise

    return wrapped


def run_bash(sandbox, args, limits) -> ToolOutput:
    timeout = min(args.get("timeout", limits.bash_timeout_s), limits.bash_timeout_s)
    timeout = max(1.0, min(timeout, limits.time_left_s()))
    result = sandbox.exec(args["command"], timeout=timeout)
    text = result.output
    if result.timed_out:
        text += f"\n[command timed out after {timeout:.0f}s and was killed]"
    return ToolOutput(
        f"{text}{'' if text.endswith(chr(10)) or not text else chr(10)}"
        f"[exit code {result.exit_code}]",
        ok=result.ok,
        omitted=result.stdout_omitted + result.stderr_omitted,
    )


@_file_errors
def read_file(sandbox, args, limits) -> ToolOutput:
    data = sandbox.read_file(args["path"])
    if b"\x00" in data[:8192]:
        return _fail(f"{args['path']!r} is a binary file ({len(data)} bytes)")
    text = data.decode("utf-8", errors="replace")
    start, end = args.get("start_line"), args.get("end_line")
    if start is not None or end is not None:
        lines = text.splitlines(keepends=True)
        text = "".join(lines[(start or 1) - 1 : end])
    return ToolOutput(text)


@_file_errors
def write_file(sandbox, args, limits) -> ToolOutput:
    data = args["content"].encode("utf-8", errors="surrogatepass")
    sandbox.write_file(args["path"], data)
    return ToolOutput(f"Wrote {len(data)} bytes to {args['path']}.")


@_file_errors
def str_replace(sandbox, args, limits) -> ToolOutput:
    old, new, path = args["old_str"], args["new_str"], args["path"]
    if not old:
        return _fail("old_str must not be empty")
    text = sandbox.read_file(path).decode("utf-8", errors="surrogateescape")
    count = text.count(old)
    if count == 0:
        return _fail(f"old_str not found in {path}")
    if count > 1 and not args.get("replace_all", False):
        return _fail(
            f"old_str occurs {count} times in {path}; add context to make it unique "
            "or set replace_all"
        )
    sandbox.write_file(path, text.replace(old, new).encode("utf-8", errors="surrogateescape"))
    return ToolOutput(f"Replaced {count} occurrence{'s' * (count > 1)} in {path}.")


def list_dir(sandbox, args, limits) -> ToolOutput:
    path, depth = args.get("path", "."), int(args.get("depth", 2))
    ws = shell_quote(sandbox.workspace)
    target = path if path.startswith("/") else f"{sandbox.workspace}/{path}"
    script = (
        f"p=$(realpath -m -- {shell_quote(target)}); "
        f'case "$p" in {ws}|{ws}/*) ;; *) exit 97;; esac; '
        '[ -d "$p" ] || exit 98; cd -- "$p" && '
        f"find . -mindepth 1 -maxdepth {depth} \\( -name .git -o -name __pycache__ \\) -prune "
        "-o -printf '%P\\t%y\\n' | LC_ALL=C sort | head -n 2000"
    )
    result = sandbox.exec(script, timeout=60)
    if result.exit_code == 97:
        return _fail(f"path {path!r} is outside the workspace")
    if result.exit_code == 98:
        return _fail(f"no such folder: {path!r}")
    entries = []
    for line in result.stdout.splitlines():
        name, _, kind = line.rpartition("\t")
        entries.append(name + ("/" if kind == "d" else ""))
    if not entries:
        return ToolOutput(f"{path} is empty.")
    return ToolOutput("\n".join(entries))


HANDLERS = {
    "bash": run_bash,
    "read_file": read_file,
    "write_file": write_file,
    "str_replace": str_replace,
    "list_dir": list_dir,
}
