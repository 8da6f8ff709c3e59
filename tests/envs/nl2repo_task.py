"""A small task folder for env tests: ``calc`` with 4 hidden tests and 1 visible test."""

from __future__ import annotations

from pathlib import Path

HIDDEN = """from calc import add, div, mul, sub


def test_add():
    assert add(2, 3) == 5


def test_sub():
    assert sub(5, 3) == 2


def test_mul():
    assert mul(4, 3) == 12


def test_div():
    assert div(8, 2) == 4
"""
VISIBLE = "from calc import add\n\n\ndef test_add_visible():\n    assert add(1, 1) == 2\n"
GOLD = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    return a / b\n"
)
PARTIAL = GOLD.replace("return a - b", "return 0").replace("return a * b", "return 0")
PARTIAL = PARTIAL.replace("return a / b", "return 0")  # passes test_add only: 0.25

TASK_TOML = """id = "calc"
title = "Four arithmetic functions"
tier = "micro"
domain = "numerics"
test_commands = ["python -m pytest -q tests"]
hidden_tests = ["tests/test_calc.py"]
test_count = 4
max_steps = 12
wall_clock_s = 300
grading_timeout_s = 60
"""


def make_task_dir(root: Path, toml: str = TASK_TOML) -> Path:
    files = {
        "task.toml": toml,
        "spec.md": "Write `calc.py` with functions add, sub, mul and div of two numbers.\n",
        "hidden_tests/tests/test_calc.py": HIDDEN,
        "visible_tests/tests/test_visible.py": VISIBLE,
        "gold/calc.py": GOLD,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}
