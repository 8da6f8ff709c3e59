"""The OpenAI Responses API (``POST /v1/responses``) through the official ``openai`` SDK's
``client.responses.create``: streaming and not, function tools, multi-turn input items and
``previous_response_id``, with the records' token ids checked like the other two APIs'.
The scripted engine (ours, real code) makes the model call tools deterministically; the
embedded engine runs the real tiny model."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gyre_env.proxy.scripted import ScriptedEngine


@pytest.fixture
def bash(bash_tool):
    """The ``bash`` function tool in the Responses API's flat form."""
    return {"type": "function", **bash_tool["function"]}


def _chain(records):
    """Each call extends the previous one's exact prompt+output ids."""
    for prev, cur in zip(records, records[1:], strict=False):
        ids = prev.prompt_ids + prev.output_ids
        assert cur.parent == prev.call_index and cur.branch == prev.branch
        assert cur.prefix_len == len(ids) and cur.prompt_ids[: len(ids)] == ids


def test_sdk_function_call_round_trip_with_input_items(start_proxy, scripted, bash):
    """A tool call comes back as a ``function_call`` item; the client sends the output
    items back with a ``function_call_output`` (no stored state) and the second call's
    prompt reuses the first call's exact ids."""
    proxy = start_proxy([scripted])
    client = openai.OpenAI(base_url=proxy.openai_base_url("rs"), api_key="k")
    items = [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "what is here?"}]},
    ]
    r = client.responses.create(model="m", input=items, tools=[bash], store=False)
    assert r.status == "completed" and [o.type for o in r.output] == ["message", "function_call"]
    assert r.output[0].content[0].text.strip() == "Let me look."
    call = r.output[1]
    assert call.name == "bash" and json.loads(call.arguments) == {"cmd": "ls -la"}
    assert r.usage.input_tokens == len(scripted.prompts[0])
    items += [o.model_dump(exclude_none=True) for o in r.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a b c"})
    r2 = client.responses.create(model="m", input=items, tools=[bash], store=False)
    assert r2.output_text == "There are 3 files." and r2.status == "completed"
    recs = proxy.records()
    assert [rec.api for rec in recs] == ["responses", "responses"]
    assert r2.usage.input_tokens_details.cached_tokens == recs[1].prefix_len > 0
    _chain(recs)
    assert recs[1].prompt_ids == scripted.prompts[1]
    assert proxy.core.metrics.render_mismatches == 0  # the delta render is the full render's


def test_sdk_stream_typed_events(start_proxy, scripted, bash):
    """Streaming: the typed events in order, text deltas that add up to the message, the
    call's arguments delta, and a ``response.completed`` carrying the whole response."""
    proxy = start_proxy([scripted])
    client = openai.OpenAI(base_url=proxy.openai_base_url("st"), api_key="k")
    events = list(client.responses.create(model="m", input="go", tools=[bash], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text_item = [
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * kinds.count("response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    call_item = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert kinds[2:-1] == text_item + call_item
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas == done.text and deltas.strip() == "Let me look."
    args = next(e for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args.delta) == {"cmd": "ls -la"}
    final = events[-1].response
    assert final.status == "completed" and final.output[1].type == "function_call"
    assert final.output[1].call_id.startswith("call_") and final.output[1].status == "completed"
    assert events[0].response.id == final.id and final.usage.output_tokens == len(
        proxy.records()[0].output_ids
    )


def test_previous_response_id_continues_the_stored_conversation(start_proxy, scripted, bash, tok):
    """With ``previous_response_id`` the client sends only the new item; the proxy
    continues the stored conversation (not its instructions) and reuses its exact ids."""
    proxy = start_proxy([scripted])
    client = openai.OpenAI(base_url=proxy.openai_base_url("prev"), api_key="k")
    r1 = client.responses.create(
        model="m", instructions="You are terse.", input="what is here?", tools=[bash]
    )
    call = r1.output[-1]
    stream = client.responses.create(
        model="m",
        instructions="You are terse.",
        previous_response_id=r1.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "a b c"}],
        tools=[bash],
        stream=True,
    )
    r2 = [e for e in stream if e.type == "response.completed"][0].response
    assert r2.output_text == "There are 3 files." and r2.previous_response_id == r1.id
    r3 = client.responses.create(
        model="m", previous_response_id=r2.id, input="thanks", tools=[bash], store=False
    )
    recs = proxy.records()
    _chain(recs[:2])
    assert recs[2].parent is None  # other instructions (none): a new prompt, a new branch
    third = tok.decode(recs[2].prompt_ids)
    assert "You are terse." not in third and "what is here?" in third and "a b c" in third
    with pytest.raises(openai.BadRequestError) as e:  # store=False: not kept
        client.responses.create(model="m", previous_response_id=r3.id, input="more")
    assert e.value.code == "previous_response_not_found" and r3.id in e.value.message
    got = client.responses.retrieve(r2.id)  # a stored response, as it was returned
    assert got.id == r2.id and got.output_text == r2.output_text and got.usage == r2.usage
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r3.id)
    other = openai.OpenAI(base_url=proxy.openai_base_url("another"), api_key="k")
    with pytest.raises(openai.NotFoundError):  # responses belong to their session
        other.responses.retrieve(r2.id)


def test_item_reference_and_reasoning_items(start_proxy, scripted, bash, tok):
    """An ``item_reference`` is an output item of a stored response; a ``reasoning``
    item joins the assistant turn it precedes. Namespace functions are offered and their
    calls name the namespace."""
    proxy = start_proxy([scripted])
    client = openai.OpenAI(base_url=proxy.openai_base_url("ref"), api_key="k")
    tools = [{"type": "namespace", "name": "sys", "description": "system", "tools": [bash]}]
    tools.append({"type": "web_search"})  # hosted: not offered, not an error
    r1 = client.responses.create(model="m", input="look", tools=tools)
    call = r1.output[-1]
    assert call.name == "bash" and call.namespace == "sys"
    items = [
        {"role": "user", "content": "look"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        *({"type": "item_reference", "id": o.id} for o in r1.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "a b c"},
    ]
    r2 = client.responses.create(model="m", input=items, tools=tools)
    assert r2.output_text == "There are 3 files."
    prompt = tok.decode(proxy.records()[1].prompt_ids)
    assert "a b c" in prompt and prompt.count('"name": "bash"') >= 2
    assert proxy.core.metrics.render_mismatches == 0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {"model": "m", "input": [{"type": "computer_call_output", "call_id": "c"}]},
            ["input[0].type", "computer_call_output"],
        ),
        ({"model": "m"}, ["input: required"]),
        ({"model": "m", "input": 7}, ["input", "integer"]),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, ["input[0].role", "robot"]),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            ["input[0].content[0].type", "input_image"],
        ),
        ({"model": "m", "input": "x", "tools": [{"type": "hologram"}]}, ["tools[0].type"]),
        ({"model": "m", "input": "x", "temperature": 3}, ["temperature"]),
        ({"model": "m", "input": "x", "previous_response_id": "resp_nope"}, ["resp_nope"]),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, ["input[0].call_id"]),
        (
            {"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}},
            ["text.format", "json_schema"],
        ),
    ],
)
def test_malformed_requests_get_400_in_the_api_shape(start_proxy, enc, body, words):
    proxy = start_proxy([ScriptedEngine([enc("ok<|im_end|>")])])
    r = httpx.post(proxy.openai_base_url("bad") + "/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert all(w in err["message"] for w in words), err
    assert proxy.records() == []


def test_session_key_is_required(start_proxy, enc):
    """The route is held to the session's key like the other model routes."""
    proxy = start_proxy([ScriptedEngine([enc("ok<|im_end|>")] * 2)])
    key = proxy.bind_session("keyed")
    url = proxy.openai_base_url("keyed")
    wrong = openai.OpenAI(base_url=url, api_key="not-the-key")
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model="m", input="hi")
    right = openai.OpenAI(base_url=url, api_key=key)
    assert right.responses.create(model="m", input="hi").output_text == "ok"


def test_real_model_stream_records_chain_exactly(start_proxy, embedded, bash):
    """The tiny model samples freely; streamed responses continued by
    ``previous_response_id`` each extend the previous prompt and sampled ids exactly,
    with one logprob per sampled id."""
    proxy = start_proxy([embedded])
    client = openai.OpenAI(base_url=proxy.openai_base_url("real"), api_key="k")
    previous = None
    for turn in range(3):
        stream = client.responses.create(
            model="m",
            input=f"héllo 世界, turn {turn}",
            previous_response_id=previous,
            max_output_tokens=16,
            tools=[bash],
            stream=True,
        )
        last = list(stream)[-1]
        assert last.type in ("response.completed", "response.incomplete")
        previous = last.response.id
    recs = proxy.records()
    assert len(recs) == 3
    _chain(recs)
    assert all(len(r.output_logprobs) == len(r.output_ids) > 0 for r in recs)
    assert all(r.weight_version == embedded.weight_version for r in recs)


def test_cut_and_failed_responses(start_proxy, enc):
    """``max_output_tokens`` reached: ``response.incomplete`` naming the reason. An engine
    that dies mid-stream: the stream ends with ``response.failed`` carrying the error,
    and that response is not stored for ``previous_response_id``."""
    engine = ScriptedEngine([enc("one two three four five six seven")], chunk_size=2)
    proxy = start_proxy([engine])
    client = openai.OpenAI(base_url=proxy.openai_base_url("cut"), api_key="k")
    r = client.responses.create(model="m", input="count", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    engine.fail_next(after_tokens=4)
    events = list(client.responses.create(model="m", input="again", stream=True))
    assert events[-1].type == "response.failed", [e.type for e in events]
    failed = events[-1].response
    assert failed.status == "failed" and "died mid-request" in failed.error.message
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="m", previous_response_id=failed.id, input="go on")
    assert [rec.finish_reason for rec in proxy.records()] == ["length", "error"]
