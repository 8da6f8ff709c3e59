"""Both backends define every member of the ``Trainer`` protocol (attributes, the
``version`` property, methods with the protocol's parameters), so callers never test a
trainer for a capability; a member added to the protocol and missing from a backend
fails here."""

from __future__ import annotations

import inspect

import pytest
from gyre_env.trainers.protocol import Trainer


def protocol_members(proto) -> dict[str, str]:
    """The protocol's own members (Python 3.11 has no ``typing.get_protocol_members``):
    ``name -> "attribute" | "property" | "method"``, over its protocol bases too."""
    out: dict[str, str] = {}
    for base in reversed(proto.__mro__):
        if not getattr(base, "_is_protocol", False) or base.__name__ in ("Protocol", "Generic"):
            continue
        for name in base.__dict__.get("__annotations__", {}):
            out[name] = "attribute"
        for name, value in vars(base).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                out[name] = "property"
            elif inspect.isfunction(value):
                out[name] = "method"
    return out


def _annotations(cls) -> set[str]:
    return {n for c in cls.__mro__ for n in c.__dict__.get("__annotations__", {})}


def _same_parameters(want, got) -> str | None:
    """Why ``got`` cannot be called as the protocol's ``want`` (None: it can)."""
    have = inspect.signature(got).parameters
    for name, p in inspect.signature(want).parameters.items():
        q = have.get(name)
        if q is None:
            return f"no parameter {name!r}"
        if q.kind != p.kind:
            return f"{name!r} is {q.kind.description}, not {p.kind.description}"
        if p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            return f"{name!r} has no default"
    return None


def missing_members(cls, proto=Trainer) -> list[str]:
    """The members of ``proto`` that ``cls`` lacks or defines differently."""
    problems = []
    for name, kind in protocol_members(proto).items():
        if kind == "attribute":
            if name not in _annotations(cls):
                problems.append(f"{name}: not declared on the class")
            continue
        value = inspect.getattr_static(cls, name, None)
        if value is None:
            problems.append(f"{name}: missing")
        elif kind == "property" and not isinstance(value, property):
            problems.append(f"{name}: not a property")
        elif kind == "method":
            if not inspect.isfunction(value):
                problems.append(f"{name}: not a method")
            elif why := _same_parameters(getattr(proto, name), value):
                problems.append(f"{name}: {why}")
    return problems


def test_the_protocol_declares_what_the_drivers_and_the_core_cell_call():
    members = protocol_members(Trainer)
    for name in (
        "train_step", "reset_optimizer", "optimizer_step", "zero_grads", "accumulate_grads",
        "grad_buffers", "apply_grads", "set_reference", "state_dict", "load_state_dict",
        "named_parameters", "load_named_parameters", "save_pretrained", "offload", "onload",
    ):  # fmt: skip
        assert members.get(name) == "method", name
    assert members["version"] == "property"
    for name in ("config", "loss", "device", "model", "optimizer", "reference"):
        assert members.get(name) == "attribute", name


def test_the_torch_backend_defines_every_protocol_member():
    from gyre_env.trainers.torch_backend import TorchTrainer

    assert missing_members(TorchTrainer) == []


def test_the_megatron_backend_defines_every_protocol_member():
    pytest.importorskip("megatron.core", reason="pip install 'gyre-env[megatron]'")
    from gyre_env.trainers.megatron.trainer import MegatronTrainer

    assert missing_members(MegatronTrainer) == []


def test_a_backend_missing_a_member_or_a_parameter_is_named():
    from gyre_env.trainers.torch_backend import TorchTrainer

    class Partial(TorchTrainer):
        grad_buffers = None  # a backend without it

        def save_pretrained(self, folder):  # no ``write``
            return folder

    assert missing_members(Partial) == [
        "grad_buffers: missing",
        "save_pretrained: no parameter 'write'",
    ]
