"""Spaces for text environments: any-Unicode text and tool calls.

Gymnasium's ``Text`` space only contains strings made of its charset, and its default
charset is alphanumeric: a shell transcript with a space or a newline is not "in" it,
so ``check_env`` fails on any real text env. ``UnicodeText`` contains every ``str`` of
allowed length; its charset only drives ``sample()``.

``ToolCallSpace`` is the action space of tool-using envs. An action is a dict
``{"name": str, "arguments": str | dict}`` (``arguments`` is JSON text, as OpenAI and
Anthropic tool calls carry it, or an already parsed dict; an optional ``"id"`` is
ignored). ``contains`` checks that shape only: an unknown tool or bad arguments are a
*valid action with a bad outcome* (the env answers with an error the agent can read),
while ``validate_call`` tells whether a call fits a tool's schema. ``sample()`` returns
calls that pass ``validate_call``.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

SAMPLE_CHARSET = (
    string.ascii_letters
    + string.digits
    + " \n\t.,;:!?-_()[]{}'\"/#=+*<>"
    + ("éüßøλπЖж中文日本語—“”🙂")
)
"""Characters ``UnicodeText.sample`` draws from: printable ASCII, whitespace and some
non-ASCII letters and symbols. Membership (``contains``) does not depend on it."""

ACTION_KEYS = frozenset({"name", "arguments", "id"})


class UnicodeText(spaces.Text):
    """A text space that contains any Unicode string of length ``min_length..max_length``.

    ``sample()`` draws lengths up to ``min(max_length, sample_max_length)`` so that sampling
    a space with a multi-megabyte limit stays cheap.
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        sample_charset: str = SAMPLE_CHARSET,
        sample_max_length: int = 256,
        seed: int | np.random.Generator | None = None,
    ):
        super().__init__(max_length, min_length=min_length, charset=sample_charset, seed=seed)
        if sample_max_length < min_length:
            raise ValueError(
                f"sample_max_length ({sample_max_length}) must be >= min_length ({min_length})"
            )
        self.sample_max_length = int(sample_max_length)

    def sample(self, mask=None, probability=None) -> str:
        if mask is None and probability is None:
            top = min(self.max_length, self.sample_max_length)
            length = int(self.np_random.integers(self.min_length, top + 1))
            mask = (length, None)
        return super().sample(mask=mask, probability=probability)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        """Arbitrary Unicode has no fixed per-character index, so no flat array form."""
        return False

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )


class ToolCallSpace(spaces.Space):
    """Tool calls against a fixed list of tools described by JSON schemas.

    Each tool is ``{"name": str, "description": str, "parameters": <JSON schema object>}``.
    String parameters may list ``"examples"``; ``sample()`` draws from them (so a sampled
    ``bash`` call runs a harmless example command, not random bytes).
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]], seed: int | None = None):
        names = [t.get("name") for t in tools]
        if not tools or not all(isinstance(n, str) and n for n in names):
            raise ValueError("ToolCallSpace needs at least one tool, each with a non-empty name")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names in {names}")
        for tool in tools:
            params = tool.get("parameters", {})
            if params.get("type", "object") != "object":
                raise ValueError(f"tool {tool['name']!r}: parameters must be a JSON object schema")
        self.tools = [json.loads(json.dumps(t)) for t in tools]  # private deep copy
        self._by_name = {t["name"]: t for t in self.tools}
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def tool_names(self) -> list[str]:
        return list(self._by_name)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return action_shape_error(x) is None

    def sample(self, mask: Any = None, probability: Any = None) -> dict[str, str]:
        """A random valid call: a tool drawn uniformly, arguments drawn from its schema."""
        if mask is not None or probability is not None:
            raise NotImplementedError("ToolCallSpace.sample does not support masks")
        tool = self.tools[int(self.np_random.integers(len(self.tools)))]
        args = _sample_object(tool.get("parameters", {}), self.np_random)
        return {"name": tool["name"], "arguments": json.dumps(args, ensure_ascii=False)}

    def validate_call(self, action: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """``(arguments, None)`` for a call that fits its tool, else ``(None, why)``."""
        shape = action_shape_error(action)
        if shape is not None:
            return None, shape
        name = action["name"]
        if name not in self._by_name:
            return None, f"unknown tool {name!r}; available tools: {', '.join(self._by_name)}"
        raw = action["arguments"]
        if isinstance(raw, str):
            try:
                args = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError as e:
                return None, f"arguments of {name!r} are not valid JSON: {e}"
        else:
            args = dict(raw)
        if not isinstance(args, dict):
            return None, f"arguments of {name!r} must be a JSON object, got {type(args).__name__}"
        errors = validate_arguments(self._by_name[name].get("parameters", {}), args)
        if errors:
            return None, f"bad arguments for {name!r}: " + "; ".join(errors)
        return args, None

    def to_jsonable(self, sample_n: Sequence[dict]) -> list[dict]:
        return [dict(s) for s in sample_n]

    def from_jsonable(self, sample_n: list[dict]) -> list[dict]:
        return [dict(s) for s in sample_n]

    def __repr__(self) -> str:
        return f"ToolCallSpace({self.tool_names})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolCallSpace) and self.tools == other.tools


def action_shape_error(x: Any) -> str | None:
    """Why ``x`` is not shaped like a tool call, or None when it is."""
    if not isinstance(x, Mapping):
        return f"a tool call must be a dict, got {type(x).__name__}"
    missing = {"name", "arguments"} - set(x)
    if missing:
        return f"a tool call needs keys 'name' and 'arguments'; missing {sorted(missing)}"
    extra = set(x) - ACTION_KEYS
    if extra:
        return f"unknown keys {sorted(extra)} in tool call; allowed: {sorted(ACTION_KEYS)}"
    if not isinstance(x["name"], str):
        return f"tool call 'name' must be a str, got {type(x['name']).__name__}"
    if not isinstance(x["arguments"], (str, Mapping)):
        return (
            "tool call 'arguments' must be a JSON string or a dict, got "
            f"{type(x['arguments']).__name__}"
        )
    return None


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def validate_arguments(schema: Mapping[str, Any], args: Mapping[str, Any]) -> list[str]:
    """Check ``args`` against an object schema: required, known keys, types, bounds, enum.

    Covers the JSON Schema subset tool definitions use; returns one message per problem.
    """
    props = schema.get("properties", {})
    errors = [
        f"missing required argument {k!r}" for k in schema.get("required", []) if k not in args
    ]
    if schema.get("additionalProperties", True) is False:
        errors += [
            f"unknown argument {k!r} (known: {', '.join(props) or 'none'})"
            for k in args
            if k not in props
        ]
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            continue
        kind = spec.get("type")
        types = _JSON_TYPES.get(kind, (object,))
        if not isinstance(value, types) or (
            kind in ("integer", "number") and isinstance(value, bool)
        ):
            errors.append(f"argument {key!r} must be {kind}, got {type(value).__name__}")
            continue
        if "enum" in spec and value not in spec["enum"]:
            errors.append(f"argument {key!r} must be one of {spec['enum']}, got {value!r}")
        if "minimum" in spec and value < spec["minimum"]:
            errors.append(f"argument {key!r} must be >= {spec['minimum']}, got {value}")
        if "maximum" in spec and value > spec["maximum"]:
            errors.append(f"argument {key!r} must be <= {spec['maximum']}, got {value}")
    return errors


def _sample_object(schema: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    required = set(schema.get("required", []))
    out = {}
    for key, spec in schema.get("properties", {}).items():
        if key in required or rng.random() < 0.5:
            out[key] = _sample_value(spec, rng)
    return out


def _sample_value(spec: Mapping[str, Any], rng: np.random.Generator) -> Any:
    if "enum" in spec:
        return spec["enum"][int(rng.integers(len(spec["enum"])))]
    if spec.get("examples"):
        return spec["examples"][int(rng.integers(len(spec["examples"])))]
    kind = spec.get("type")
    if kind == "boolean":
        return bool(rng.integers(2))
    if kind in ("integer", "number"):
        low = spec.get("minimum", 0)
        high = spec.get("maximum", low + 100)
        return int(rng.integers(low, high + 1))
    if kind == "string":
        length = int(rng.integers(0, 65))
        chars = rng.choice(list(SAMPLE_CHARSET), size=length)
        return "".join(chars)
    raise ValueError(f"cannot sample a value for schema {dict(spec)!r}")
