"""The Claude Code CLI (``npm install -g @anthropic-ai/claude-code``) headless against the
proxy: its streaming ``/v1/messages?beta=true`` calls (a dozen tools, thinking and
context-management fields, mid-conversation system messages) land as TITO records.

The engine is scripted so that the CLI is driven into a real tool call deterministically:
the first answer calls ``Bash``, the next (once a tool result is in the prompt) finishes.
(The real tiny model is not used here: Claude Code's ~32k-token first prompt takes the
embedded engine about 40 s to prefill on a 2-core CPU.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from gyre_env.proxy.scripted import ScriptedEngine

CLAUDE = shutil.which("claude")


@pytest.fixture
def claude_env(tmp_path):
    if CLAUDE is None:
        if os.environ.get("CI"):
            pytest.fail(
                "CI must install the Claude Code CLI: npm install -g @anthropic-ai/claude-code"
            )
        pytest.skip("needs the Claude Code CLI (npm install -g @anthropic-ai/claude-code)")
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        HOME=str(home),
        ANTHROPIC_API_KEY="dummy",
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        IS_SANDBOX="1",
    )
    return env, work


def _run_claude(env: dict, work, base_url: str, prompt: str) -> dict:
    proc = subprocess.run(
        [
            CLAUDE,
            "-p",
            prompt,
            "--output-format",
            "json",
            "--dangerously-skip-permissions",
            "--max-turns",
            "4",
        ],
        env={**env, "ANTHROPIC_BASE_URL": base_url},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0 or proc.stdout, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_claude_code_tool_call_lands_as_tito_records(start_proxy, enc, tok, claude_env):
    env, work = claude_env
    tool_response = enc("<tool_response>")[0]
    call = enc(
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo gyre-was-here > proof.txt && '
        'echo written", "description": "write proof"}}\n</tool_call><|im_end|>'
    )
    done = enc("All done.<|im_end|>")
    engine = ScriptedEngine(
        lambda prompt, params: done if tool_response in prompt else call, chunk_size=4
    )
    proxy = start_proxy([engine])
    result = _run_claude(env, work, proxy.anthropic_base_url("cc-episode"), "write the proof file")

    assert result["is_error"] is False and result["result"] == "All done.", result
    assert (work / "proof.txt").read_text().strip() == "gyre-was-here", (
        "the CLI ran the scripted tool call"
    )
    recs = [r for r in proxy.records() if r.session == "cc-episode"]
    assert len(recs) >= 2
    first, second = recs[0], recs[-1]
    assert first.api == "anthropic" and first.role == "main" and first.output_ids == call
    assert first.finish_reason == "tool_calls" and second.output_ids == done
    assert len(first.prompt_ids) > 5000, "Claude Code's system prompt and tools are rendered"
    assert second.parent == first.call_index and second.branch == first.branch
    ids = first.prompt_ids + first.output_ids
    assert second.prompt_ids[: len(ids)] == ids and second.prefix_len == len(ids)
    assert "written" in tok.decode(second.prompt_ids[len(ids) :]), (
        "the tool's output is in the next prompt"
    )
    assert [r.prompt_ids for r in recs] == engine.prompts[: len(recs)]
    assert proxy.core.metrics.render_mismatches == 0
