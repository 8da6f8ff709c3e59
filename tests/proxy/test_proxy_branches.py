"""Branches: extensions stay on their branch; sub-agent, compaction and repeated prompts
start new ones, labelled by the (pluggable) classifier."""

from __future__ import annotations

import httpx

from gyre_env.proxy.records import JsonlSink
from gyre_env.proxy.scripted import ScriptedEngine
from gyre_env.proxy.server import ProxyConfig, ProxyServer
from gyre_env.proxy.sessions import CallContext

BILLING = "x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=sdk-cli;"


def _msg(url: str, system: str, messages: list, headers: dict | None = None) -> dict:
    body = {
        "model": "c",
        "max_tokens": 50,
        "system": [{"type": "text", "text": system}],
        "messages": messages,
    }
    r = httpx.post(url + "/v1/messages?beta=true", json=body, headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_claude_code_branches(start_proxy, enc):
    proxy = start_proxy([ScriptedEngine([enc("ok<|im_end|>")])])
    url = proxy.anthropic_base_url("cc")
    main = [{"role": "user", "content": "fix the bug"}]
    r0 = _msg(url, BILLING + "\nYou are Claude Code.", main)
    main += [
        {"role": "assistant", "content": r0["content"]},
        {"role": "user", "content": "continue"},
    ]
    # a sub-agent: its own short conversation, marked by header and billing block
    sub = [{"role": "user", "content": "search the repo"}]
    r1 = _msg(
        url,
        BILLING.replace("sdk-cli;", "sdk-cli; cc_is_subagent=true;") + "\nYou are a sub-agent.",
        sub,
        {"x-claude-code-agent-id": "a1"},
    )
    _msg(url, BILLING + "\nYou are Claude Code.", main)  # the main branch goes on
    sub += [{"role": "assistant", "content": r1["content"]}, {"role": "user", "content": "more"}]
    _msg(
        url,
        BILLING.replace("sdk-cli;", "sdk-cli; cc_is_subagent=true;") + "\nYou are a sub-agent.",
        sub,
        {"x-claude-code-agent-id": "a1"},
    )
    # compaction: the main conversation again plus the CRITICAL text block
    compact = main + [
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "CRITICAL: Respond with TEXT ONLY. "
                    "Do NOT call any tools. <analysis> then <summary>",
                }
            ],
        },
    ]
    _msg(url, BILLING + "\nYou are Claude Code.", compact)
    _msg(url, BILLING + "\nYou are Claude Code.", main)  # the same prompt again: a sibling

    recs = proxy.records()
    got = [(r.call_index, r.branch, r.parent, r.role) for r in recs]
    assert got[:5] == [
        (0, "b0", None, "main"),
        (1, "b1", None, "sub-agent"),
        (2, "b0", 0, "main"),
        (3, "b1", 1, "sub-agent"),
        (4, "b2", 2, "summary"),
    ]
    summary = recs[4]
    head = recs[2].prompt_ids + recs[2].output_ids
    assert summary.prompt_ids[: len(head)] == head and summary.prefix_len == len(head)
    sibling = recs[5]
    assert (
        sibling.branch == "b3" and sibling.parent == 0 and sibling.prompt_ids == recs[2].prompt_ids
    )


def test_custom_classifier_and_api_key_sessions(tok, tmp_path, enc):
    seen: list[CallContext] = []

    def classify(ctx: CallContext):
        seen.append(ctx)
        return "sub-agent" if ctx.headers.get("x-role") == "sub" else "main"

    path = tmp_path / "r.jsonl"
    server = ProxyServer(
        ProxyConfig(),
        engines=[ScriptedEngine([enc("hi<|im_end|>")])],
        tokenizer=tok,
        sink=JsonlSink(path),
        classifier=classify,
    ).start()
    try:
        for key, role in (("episode-A", "sub"), ("episode-B", "main")):
            r = httpx.post(
                server.base_url + "/v1/chat/completions",
                timeout=30,
                headers={"authorization": f"Bearer {key}", "x-role": role},
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            )
            assert r.status_code == 200
    finally:
        server.stop()
    from gyre_env.proxy.records import read_jsonl

    recs = read_jsonl(path)
    assert [(r.session, r.role) for r in recs] == [
        ("episode-A", "sub-agent"),
        ("episode-B", "main"),
    ]
    assert [c.session for c in seen] == ["episode-A", "episode-B"]


def test_compact_jsonl_restores_full_prompts(tmp_path, start_proxy, enc):
    """A long session's compact file stores suffixes only and reads back the full ids."""
    from gyre_env.proxy.records import read_jsonl

    engine = ScriptedEngine([enc("fine<|im_end|>")])
    proxy = start_proxy([engine])
    path = tmp_path / "compact.jsonl"
    proxy.core.sink = JsonlSink(path, compact=True)
    url = proxy.openai_base_url("long")
    msgs = [{"role": "user", "content": "word " * 500}]
    for turn in range(3):
        r = httpx.post(
            url + "/chat/completions", json={"model": "m", "messages": msgs}, timeout=30
        ).json()
        msgs += [r["choices"][0]["message"], {"role": "user", "content": f"next {turn}"}]
    proxy.core.sink.close()
    compact = read_jsonl(path)
    assert [r.prompt_ids for r in compact] == engine.prompts
    assert compact[2].prefix_len > 500
    assert path.stat().st_size < 0.6 * sum(len(str(p)) for p in engine.prompts)
