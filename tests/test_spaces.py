"""UnicodeText and ToolCallSpace: membership, sampling, validation."""

from __future__ import annotations

import json

import pytest
from gymnasium import spaces

from gyre_env.spaces import ToolCallSpace, UnicodeText, validate_arguments

TOOLS = [
    {
        "name": "bash",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "examples": ["ls", "true"]},
                "timeout": {"type": "integer", "minimum": 1, "maximum": 10},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "name": "write_file",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "append": {"type": "boolean"},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
    {"name": "submit", "parameters": {"type": "object", "properties": {}}},
]


def test_gymnasium_text_rejects_what_unicode_text_accepts():
    text = "def f(x):\n    return x  # ünïcødé 中文 🙂\n"
    assert not spaces.Text(1000).contains(text)  # why UnicodeText exists
    space = UnicodeText(1000)
    assert space.contains(text) and space.contains("")
    assert not space.contains("x" * 1001)
    assert not space.contains(b"bytes") and not space.contains(None)


def test_unicode_text_samples_are_members_and_seeded():
    space = UnicodeText(1 << 22, sample_max_length=64, seed=3)
    samples = [space.sample() for _ in range(50)]
    assert all(space.contains(s) and len(s) <= 64 for s in samples)
    space.seed(3)
    assert [space.sample() for _ in range(50)] == samples
    assert any(" " in s or "\n" in s for s in samples)
    assert UnicodeText(10) == UnicodeText(10) and UnicodeText(10) != UnicodeText(11)


def test_tool_call_samples_are_valid_calls():
    space = ToolCallSpace(TOOLS, seed=0)
    names = set()
    for _ in range(300):
        action = space.sample()
        assert space.contains(action)
        args, error = space.validate_call(action)
        assert error is None, error
        assert args == json.loads(action["arguments"])
        names.add(action["name"])
    assert names == {"bash", "write_file", "submit"}
    space.seed(7)
    first = [space.sample() for _ in range(20)]
    space.seed(7)
    assert [space.sample() for _ in range(20)] == first


@pytest.mark.parametrize(
    "action, why",
    [
        ({"name": "rm", "arguments": "{}"}, "unknown tool 'rm'"),
        ({"name": "bash", "arguments": "{not json"}, "not valid JSON"),
        ({"name": "bash", "arguments": "[1]"}, "must be a JSON object"),
        ({"name": "bash", "arguments": {}}, "missing required argument 'command'"),
        ({"name": "bash", "arguments": {"command": 3}}, "'command' must be string"),
        ({"name": "bash", "arguments": {"command": "ls", "x": 1}}, "unknown argument 'x'"),
        ({"name": "bash", "arguments": {"command": "ls", "timeout": 99}}, "must be <= 10"),
        ({"name": "bash", "arguments": {"command": "ls", "timeout": True}}, "must be integer"),
    ],
)
def test_validate_call_explains_bad_calls(action, why):
    space = ToolCallSpace(TOOLS)
    assert space.contains(action)  # shaped like a call: the env answers with an error
    args, error = space.validate_call(action)
    assert args is None and why in error


@pytest.mark.parametrize(
    "action",
    [
        "bash ls",
        None,
        {"name": "bash"},
        {"name": 1, "arguments": "{}"},
        {"name": "bash", "arguments": 5},
        {"name": "bash", "arguments": "{}", "x": 1},
    ],
)
def test_contains_rejects_non_calls(action):
    space = ToolCallSpace(TOOLS)
    assert not space.contains(action)
    assert space.validate_call(action)[0] is None


def test_tool_call_space_rejects_bad_tool_lists():
    with pytest.raises(ValueError, match="duplicate"):
        ToolCallSpace([TOOLS[0], TOOLS[0]])
    with pytest.raises(ValueError, match="at least one tool"):
        ToolCallSpace([])
    with pytest.raises(ValueError, match="JSON object schema"):
        ToolCallSpace([{"name": "x", "parameters": {"type": "string"}}])


def test_validate_arguments_enum_and_number():
    schema = {
        "properties": {
            "mode": {"type": "string", "enum": ["a", "b"]},
            "n": {"type": "number", "minimum": 0},
        }
    }
    assert validate_arguments(schema, {"mode": "a", "n": 1.5}) == []
    assert len(validate_arguments(schema, {"mode": "c", "n": -1})) == 2
