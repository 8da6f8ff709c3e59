"""The official ``openai`` and ``anthropic`` SDKs and LangChain's ``ChatOpenAI`` against the
proxy, streaming and not, with tool calls (scripted engine drives the tool calls)."""

from __future__ import annotations

import anthropic
import openai

ANTHROPIC_TOOL = {
    "name": "bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
    },
}


def test_openai_sdk_tool_round_trip(start_proxy, scripted, bash_tool):
    proxy = start_proxy([scripted])
    client = openai.OpenAI(base_url=proxy.openai_base_url("oa"), api_key="k")
    msgs = [{"role": "user", "content": "what is here?"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=[bash_tool])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    call = choice.message.tool_calls[0]
    assert call.function.name == "bash" and call.function.arguments == '{"cmd": "ls -la"}'
    assert r.usage.prompt_tokens == len(scripted.prompts[0])
    msgs += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a b c"},
    ]
    r2 = client.chat.completions.create(model="m", messages=msgs, tools=[bash_tool])
    assert (
        r2.choices[0].message.content == "There are 3 files."
        and r2.choices[0].finish_reason == "stop"
    )
    recs = proxy.records()
    assert [r.parent for r in recs] == [None, 0] and recs[1].prefix_len > 0


def test_openai_sdk_streaming_tool_call_deltas(start_proxy, scripted, bash_tool):
    proxy = start_proxy([scripted])
    client = openai.OpenAI(base_url=proxy.openai_base_url("oas"), api_key="k")
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "go"}],
        tools=[bash_tool],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, calls, finish, usage = "", {}, None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "args": ""})
                entry["name"] += tc.function.name or ""
                entry["args"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert text.strip() == "Let me look."
    assert calls == {0: {"name": "bash", "args": '{"cmd": "ls -la"}'}}
    assert finish == "tool_calls"
    assert usage.prompt_tokens == len(scripted.prompts[0]) and usage.completion_tokens == len(
        proxy.records()[0].output_ids
    )


def test_anthropic_sdk_tool_use_and_results(start_proxy, scripted):
    proxy = start_proxy([scripted])
    client = anthropic.Anthropic(base_url=proxy.anthropic_base_url("an"), api_key="k")
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"},
        {"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}},
    ]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "what is here?"}]}]
    r = client.messages.create(
        model="claude-x",
        max_tokens=4096,
        system=system,
        messages=msgs,
        tools=[ANTHROPIC_TOOL],
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "u"},
    )
    assert r.stop_reason == "tool_use"
    assert [b.type for b in r.content] == ["text", "tool_use"]
    use = r.content[1]
    assert use.name == "bash" and use.input == {"cmd": "ls -la"}
    assert r.usage.input_tokens == len(scripted.prompts[0])
    msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": [{"type": "text", "text": "a b c"}],
                },
                {"type": "text", "text": "<system-reminder>be brief</system-reminder>"},
            ],
        },
        # a mid-conversation system message, as Claude Code sends
    ]
    r2 = client.messages.create(
        model="claude-x", max_tokens=512, system=system, messages=msgs, tools=[ANTHROPIC_TOOL]
    )
    assert r2.stop_reason == "end_turn" and r2.content[0].text == "There are 3 files."
    msgs += [
        {"role": "assistant", "content": r2.content[0].text},
        {"role": "system", "content": [{"type": "text", "text": "Note: context is fine."}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "x", "is_error": True}
            ],
        },
    ]
    r3 = client.beta.messages.create(
        model="claude-x",
        max_tokens=64,
        system=system,
        messages=msgs,
        tools=[ANTHROPIC_TOOL],
        betas=["context-management-2025-06-27"],
    )
    assert r3.stop_reason == "end_turn"
    recs = proxy.records()
    assert [r.parent for r in recs] == [None, 0, 1]
    assert all(r.api == "anthropic" for r in recs) and proxy.core.metrics.render_mismatches == 0


def test_anthropic_sdk_streaming(start_proxy, scripted):
    proxy = start_proxy([scripted])
    client = anthropic.Anthropic(base_url=proxy.anthropic_base_url("ans"), api_key="k")
    with client.messages.stream(
        model="c",
        max_tokens=100,
        tools=[ANTHROPIC_TOOL],
        messages=[{"role": "user", "content": "go"}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert (
        kinds[0] == "message_start"
        and "content_block_delta" in kinds
        and kinds[-1] == "message_stop"
    )
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].input == {"cmd": "ls -la"}
    assert "Let me look." in "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.output_tokens == len(proxy.records()[0].output_ids)


def test_langchain_chat_openai(start_proxy, scripted, bash_tool):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    proxy = start_proxy([scripted])
    llm = ChatOpenAI(model="m", base_url=proxy.openai_base_url("lc"), api_key="k", max_retries=0)
    bound = llm.bind_tools([bash_tool])
    first = bound.invoke([HumanMessage("what is here?")])
    assert first.tool_calls[0]["name"] == "bash" and first.tool_calls[0]["args"] == {
        "cmd": "ls -la"
    }
    history = [
        HumanMessage("what is here?"),
        first,
        ToolMessage("a b c", tool_call_id=first.tool_calls[0]["id"]),
    ]
    chunks = list(bound.stream(history))
    assert "".join(c.content for c in chunks) == "There are 3 files."
    recs = proxy.records()
    assert recs[1].parent == 0 and recs[1].prefix_len == len(recs[0].prompt_ids) + len(
        recs[0].output_ids
    )


def test_min_p_reaches_the_engine_from_each_agents_client(start_proxy, enc):
    """``min_p`` as each rollout agent sends it (LangGraph's ChatOpenAI and mini-swe-agent's
    litellm, as an extra body field; Anthropic's API as a body field) reaches the engine's
    SamplingParams and the call's record; without it the filter is off."""
    import contextlib
    from types import SimpleNamespace

    from gyre_env.agents.langgraph_agent import LangGraphAgentConfig, _chat_model
    from gyre_env.agents.mini_swe_agent import MiniSweAgentConfig, ProxyModel
    from minisweagent.exceptions import FormatError

    from gyre_env.proxy.endpoint import ModelEndpoint
    from gyre_env.proxy.scripted import ScriptedEngine

    seen = []
    done = enc("```bash\necho hi\n```<|im_end|>")
    proxy = start_proxy([ScriptedEngine(lambda prompt, params: seen.append(params.min_p) or done)])

    def ctx(session):
        ep = ModelEndpoint(base_url=proxy.openai_base_url(session), model="m", api_key="k")
        return SimpleNamespace(endpoint=ep, episode_id=session)

    for min_p in (0.05, 0.0):
        lg = _chat_model(ctx(f"lg{min_p}"), LangGraphAgentConfig(min_p=min_p), "main")
        lg.invoke("hi")
        msa = ProxyModel(ctx(f"msa{min_p}"), MiniSweAgentConfig(min_p=min_p), {})
        with contextlib.suppress(FormatError):  # the reply has no tool call; the call ran
            msa.inner.query([{"role": "user", "content": "hi"}])
    anth = anthropic.Anthropic(base_url=proxy.anthropic_base_url("an"), api_key="k")
    anth.messages.create(
        model="m",
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"min_p": 0.3},
    )
    assert seen == [0.05, 0.05, 0.0, 0.0, 0.3]
    assert [r.sampling["min_p"] for r in proxy.records()] == seen
