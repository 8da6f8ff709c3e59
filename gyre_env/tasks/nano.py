"""The ``nano`` tier: generated one-function tasks small enough for a tiny model to learn.

Each task asks, in one sentence, for one function in ``solution.py`` whose gold body is a
single ``return`` line (``def add_seven(x):\\n    return x + 7\\n``). A task is a variant
of an operation template: a function name from the template's pool, an argument name, a
constant (a digit or a short word) and one of the template's phrasings. Its four hidden
tests check the return type and three values, so a wrong constant still scores 0.25 and
a wrong function name scores 0; one visible test checks one value.

Splits are disjoint by construction: the split unit is the variant key (template,
function name, constant); per template, the 20% of keys (at least one) with the lowest
stable hash are ``heldout``, the rest ``train``, so every template is in both splits and
no heldout function/constant pairing is ever trained on, whatever the argument name or
phrasing. ``nano_tasks(split, count, seed)`` draws ``count`` tasks round-robin over the
templates (balanced), deterministically for a seed, and materialises them as ordinary
task folders under ``cache_root()/tasks/nano`` (written atomically, reused when present;
a folder name carries a digest of its files, so a changed generator never reads a stale
folder). The standard loader, grader and ``GoldAgent`` then work unchanged.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import os
import random
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from gyre_env.paths import cache_root
from gyre_env.tasks.task import Task, load_task

SPLITS = ("train", "heldout")
TUNING_SPLITS = ("fit", "validation")
"""The train split cut in two for tuning: ``validation`` takes, per template, the
``HELDOUT_PERCENT`` of the train keys (at least one) with the lowest stable hash, the way
``heldout`` is cut from all keys, so it is built like the held-out split; ``fit`` is the
rest of ``train``. Choose settings by training on ``fit`` and evaluating on
``validation``; then train on ``train`` and report ``heldout``, which no choice has seen."""
NAME_MODES = ("varied", "fixed")
"""``varied``: each template's pool of function names (the name must be copied from the
spec); ``fixed``: every function is ``solve`` (what varies is the operation, the
argument name and the constant), a family a tiny model learns within minutes."""
FIXED_NAME = "solve"
HELDOUT_PERCENT = 20
"""Share of variant keys (template, name, constant) that go to ``heldout``."""
GENERATOR_VERSION = 2
"""Bump when generated content changes meaning; it seeds ids and the split hash."""
INPUT_MODES = ("fixed", "drawn")
"""``fixed``: every task of an operation tests the template's four inputs (its hidden
test file is shared with every task of that operation and argument kind); ``drawn``: each
task draws its own inputs from a generator seeded by the task, so no two tasks share a
hidden-test file and an output remembered from another task does not pass."""
PHRASING_MODES = ("all", "words", "coined", "decoys", "vague", "kinds")
"""``all``: every phrasing of a template, one of which states the returned expression
(``define solve(msg) returning msg.upper()``); ``words``: only the phrasings that describe
the operation in words, none of which contains the gold expression; ``coined``: those, and
one more per template that names the operation by a word coined for it (``returns the
vobek of msg``, :func:`coined_word`). No task of the coined phrasing carries gold, in any
split: what the word means is shown only by the grade of an attempt, so only RL's own
attempts can learn it. ``decoys``: those, and ``DECOYS`` more per template that name the
operation by other made-up words (:func:`decoy_words`), with gold, in the training split
only (``train`` and ``fit``). Gold then shows that a made-up word names an operation of
the argument's kind, so a model meets the coined word, which no gold shows, with a guess
among those operations rather than with text it has never seen. ``vague``: as ``decoys``,
but the decoy words belong to the argument's kind, not to one operation
(:func:`vague_words`): each names every operation of that kind in some gold task, so gold
shows that such a word alone does not tell which, and a model meets the coined word with
its guesses spread over the kind's operations. ``kinds``: as ``vague``, and every
made-up word's sentence names the argument's kind (``returns the vobek of the string
msg``), so that the kind is read from the spec, not guessed from an argument name the
model may never have seen: a coined word then asks for one of the two or three
operations of that kind, and a group of attempts at it usually holds a pass to learn
from (``KIND_NOUNS``)."""
KIND_NOUNS = {"int": "integer", "str": "string", "list": "list", "pair": "integers"}
"""How the ``kinds`` phrasings name an argument's kind."""
DECOYS = 3
"""Decoy words per template (``decoys``) or per argument kind (``vague``)."""

_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_ARGS = {
    "int": ("x", "n", "num", "value", "k", "m", "y", "i", "count", "size", "total", "amount"),
    "str": ("s", "text", "word", "name", "line", "label", "key", "msg", "title", "code"),
    "list": ("xs", "nums", "items", "values", "data", "arr", "seq", "vals", "elems", "ys"),
    "pair": ("a, b", "x, y", "m, n", "p, q", "i, j", "u, v"),
}
"""Argument names per kind. Many, so that a model cannot pass by memorising which name
goes with which operation: it must copy the name the spec gives."""
ARG_MODES = ("standard", "wide")
"""``standard``: the ``_ARGS`` names; ``wide``: also the ``_WIDE_ARGS`` names, which only
ever train (see ``_WIDE_ARGS``)."""
_WIDE_ARGS = {
    "int": tuple(
        (
            "z t w d c r number val qty score age level depth width height limit index offset "
            "step delta weight price cost year day hour radius speed temp balance rank_n seed "
            "port n1 x0 num2"
        ).split()
    ),
    "str": tuple(
        (
            "st txt sentence phrase token letters chars greeting city color animal fruit path "
            "url email user host tag note body caption heading slug motto verse lyric message "
            "content raw source query keyword nickname country song book"
        ).split()
    ),
    "list": tuple(
        (
            "lst numbers scores ages prices costs weights heights counts totals points marks "
            "grades row col column batch bag pile stack queue readings samples entries "
            "records digits amounts sizes levels ranks votes temps series vector arr2 zs"
        ).split()
    ),
    "pair": tuple(
        "lo, hi; left, right; x1, x2; a1, a2; n1, n2; top, bottom; base, exp; num, den; "
        "w, h; r, c; s, t; dx, dy".split("; ")
    ),
}
"""More argument names per kind (``arg_names="wide"``), none of them an ``_ARGS`` name, a
builtin, a keyword or a template key. Their variants are always ``train`` (and ``fit``):
the held-out and validation keys are cut from the ``_ARGS`` variants alone, so they are
the same tasks in both modes. With the fixed function name, where the argument names are
the split key, a held-out task pairs an operation with an ``_ARGS`` name it never trains
with; the wide names go with every operation of their kind, so that in training no name
tells which operation the spec asks for. (With ``varied`` function names the key is the
function name and the wide names join both sides of it.)"""
# python3, not python: gyre-base images built before the setup script linked `python`
# have only python3 (the grader shims both names; visible tests run as they are written).
_PYTEST = "python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors"


@dataclass(frozen=True)
class Template:
    """One operation: how to name, phrase, implement and test it."""

    key: str
    """Short id used in task ids, e.g. ``add``."""
    domain: str
    kind: str
    """Argument kind: ``int``, ``str``, ``list`` or ``pair`` (two ints)."""
    names: tuple[str, ...]
    """Function-name patterns; ``{w}`` is the constant as a word (``seven``, ``ing``)."""
    phrasings: tuple[str, ...]
    """Spec sentences; ``{f}`` function, ``{sig}`` ``f(args)``, ``{a}``/``{b}`` args, ``{k}``."""
    body: str
    """The returned expression, with ``{a}``, ``{b}`` and ``{k}``."""
    inputs: tuple[tuple, ...]
    """Four argument tuples: the first is the type check (and the visible test)."""
    consts: tuple = (None,)


def _t(key, domain, kind, names, phrasings, body, inputs, consts=(None,)) -> Template:
    return Template(
        key=key,
        domain=domain,
        kind=kind,
        names=tuple(names.split()),
        phrasings=tuple(phrasings),
        body=body,
        inputs=tuple(inputs),
        consts=tuple(consts),
    )


_W = "Write solution.py with a function {sig} that returns"
_C = "Create solution.py defining {sig}, which returns"
_D = "In solution.py, define {sig} returning"
_INTS = ((2,), (0,), (5,), (-3,))
_NONNEG = ((9,), (0,), (17,), (30,))
_STRS = (("abc",), ("Hello",), ("x1y",), ("aB c",))
_LISTS = (([3, 1, 2],), ([5],), ([-1, 7, 4, 7],), ([2, 9, 0, 1, 8],))
_PAIRS = ((2, 5), (9, 4), (-1, -6), (3, 3))
_WORDS_PRE = ("hi", "ok", "re", "un", "pre", "my", "go", "no", "up", "ex")

TEMPLATES: tuple[Template, ...] = (
    # -- arithmetic with a constant
    _t(
        "add",
        "arithmetic",
        "int",
        "add_{w} plus_{w} increase_by_{w} add{w} bump offset shift_up step_up",
        (f"{_W} {{a}} plus {{k}}.", f"{_C} {{a}} with {{k}} added.", f"{_D} {{a}} + {{k}}."),
        "{a} + {k}",
        _INTS,
        range(1, 10),
    ),
    _t(
        "sub",
        "arithmetic",
        "int",
        "sub_{w} minus_{w} decrease_by_{w} take_{w} lower shift_down step_down reduce",
        (f"{_W} {{a}} minus {{k}}.", f"{_C} {{a}} with {{k}} subtracted.", f"{_D} {{a}} - {{k}}."),
        "{a} - {k}",
        _INTS,
        range(1, 10),
    ),
    _t(
        "mul",
        "arithmetic",
        "int",
        "times_{w} mul_{w} multiply_by_{w} scale_{w} scale grow amplify boost",
        (f"{_W} {{a}} times {{k}}.", f"{_C} {{a}} multiplied by {{k}}.", f"{_D} {{a}} * {{k}}."),
        "{a} * {k}",
        _INTS,
        range(2, 10),
    ),
    _t(
        "floordiv",
        "arithmetic",
        "int",
        "div_{w} divide_by_{w} per_{w} split_{w} shrink chunks groups buckets",
        (
            f"{_W} {{a}} divided by {{k}}, rounded down.",
            f"{_C} the integer floor division of {{a}} by {{k}}.",
            f"{_D} {{a}} // {{k}}.",
        ),
        "{a} // {k}",
        _NONNEG,
        range(2, 10),
    ),
    _t(
        "mod",
        "arithmetic",
        "int",
        "mod_{w} rem_{w} modulo_{w} leftover_{w} remainder wrap cycle spare",
        (
            f"{_W} the remainder of {{a}} divided by {{k}}.",
            f"{_C} {{a}} modulo {{k}}.",
            f"{_D} {{a}} % {{k}}.",
        ),
        "{a} % {k}",
        _NONNEG,
        range(2, 10),
    ),
    # -- strings
    _t(
        "upper",
        "strings",
        "str",
        "to_upper upper shout capitals loud make_upper all_caps yell",
        (
            f"{_W} {{a}} in upper case.",
            f"{_C} {{a}} converted to uppercase.",
            f"{_D} {{a}}.upper().",
        ),
        "{a}.upper()",
        _STRS,
    ),
    _t(
        "lower",
        "strings",
        "str",
        "to_lower lower quiet small_letters soft make_lower no_caps whisper",
        (
            f"{_W} {{a}} in lower case.",
            f"{_C} {{a}} converted to lowercase.",
            f"{_D} {{a}}.lower().",
        ),
        "{a}.lower()",
        _STRS,
    ),
    _t(
        "reverse",
        "strings",
        "str",
        "reverse reversed backwards flip mirror rev turn_around invert",
        (
            f"{_W} {{a}} reversed.",
            f"{_C} the characters of {{a}} in reverse order.",
            f"{_D} {{a}}[::-1].",
        ),
        "{a}[::-1]",
        _STRS,
    ),
    _t(
        "repeat",
        "strings",
        "str",
        "repeat_{w} times_{w} copy_{w} echo_{w} repeat echo duplicate stutter",
        (
            f"{_W} {{a}} repeated {{k}} times.",
            f"{_C} {{k}} copies of {{a}} joined with nothing between them.",
            f"{_D} {{a}} * {{k}}.",
        ),
        "{a} * {k}",
        _STRS,
        range(2, 6),
    ),
    _t(
        "first_char",
        "strings",
        "str",
        "first_char first_letter initial head_char lead start_char front opening",
        (
            f"{_W} the first character of {{a}}.",
            f"{_C} the character at index 0 of the non-empty string {{a}}.",
            f"{_D} {{a}}[0].",
        ),
        "{a}[0]",
        _STRS,
    ),
    _t(
        "strip",
        "strings",
        "str",
        "strip trim clean tidy strip_spaces trim_ends neat unpad",
        (
            f"{_W} {{a}} without leading and trailing whitespace.",
            f"{_C} {{a}} with the whitespace at both ends removed.",
            f"{_D} {{a}}.strip().",
        ),
        "{a}.strip()",
        (("  hi  ",), ("a b\n",), ("x",), ("\tok ",)),
    ),
    _t(
        "prefix",
        "strings",
        "str",
        "prefix_{w} with_{w} prepend_{w} add_{w} start_{w} tag_{w} lead_{w} mark_{w}",
        (
            f'{_W} the string "{{k}}" followed by {{a}}.',
            f'{_C} {{a}} with "{{k}}" put in front.',
            f'{_D} "{{k}}" + {{a}}.',
        ),
        '"{k}" + {a}',
        _STRS,
        _WORDS_PRE,
    ),
    # -- lists of ints
    _t(
        "sum",
        "lists",
        "list",
        "total sum_all add_up sum_list tally grand_total combine accumulate",
        (
            f"{_W} the sum of the numbers in the list {{a}}.",
            f"{_C} the total of all items of the list {{a}}.",
            f"{_D} sum({{a}}).",
        ),
        "sum({a})",
        _LISTS,
    ),
    _t(
        "max",
        "lists",
        "list",
        "largest biggest max_item top highest peak most max_of",
        (
            f"{_W} the largest number in the non-empty list {{a}}.",
            f"{_C} the maximum of the list {{a}}.",
            f"{_D} max({{a}}).",
        ),
        "max({a})",
        _LISTS,
    ),
    _t(
        "min",
        "lists",
        "list",
        "smallest least min_item bottom lowest floor_of fewest min_of",
        (
            f"{_W} the smallest number in the non-empty list {{a}}.",
            f"{_C} the minimum of the list {{a}}.",
            f"{_D} min({{a}}).",
        ),
        "min({a})",
        _LISTS,
    ),
    _t(
        "length",
        "lists",
        "list",
        "count size length how_many num_items list_len count_all len_of",
        (
            f"{_W} the number of items in the list {{a}}.",
            f"{_C} the length of the list {{a}}.",
            f"{_D} len({{a}}).",
        ),
        "len({a})",
        _LISTS,
    ),
    _t(
        "first",
        "lists",
        "list",
        "first head first_item front_item get_first leader opener top_item",
        (
            f"{_W} the first item of the non-empty list {{a}}.",
            f"{_C} the item at index 0 of the list {{a}}.",
            f"{_D} {{a}}[0].",
        ),
        "{a}[0]",
        _LISTS,
    ),
    _t(
        "last",
        "lists",
        "list",
        "last tail last_item end_item get_last final closer back_item",
        (
            f"{_W} the last item of the non-empty list {{a}}.",
            f"{_C} the item at index -1 of the list {{a}}.",
            f"{_D} {{a}}[-1].",
        ),
        "{a}[-1]",
        _LISTS,
    ),
    _t(
        "sorted",
        "lists",
        "list",
        "sort_list sorted_items ascending order arrange in_order rank line_up",
        (
            f"{_W} a new list of the items of {{a}} in ascending order.",
            f"{_C} the list {{a}} sorted from smallest to largest.",
            f"{_D} sorted({{a}}).",
        ),
        "sorted({a})",
        _LISTS,
    ),
    # -- conditionals
    _t(
        "abs",
        "conditionals",
        "int",
        "absolute abs_value magnitude distance size_of unsigned positive_of modulus",
        (
            f"{_W} the absolute value of {{a}}.",
            f"{_C} {{a}} without its sign (its distance from zero).",
            f"{_D} abs({{a}}).",
        ),
        "abs({a})",
        ((-2,), (0,), (7,), (-11,)),
    ),
    _t(
        "larger",
        "conditionals",
        "pair",
        "larger bigger max_of_two pick_larger greater winner top_of_two higher",
        (
            f"{_W} the larger of {{a}} and {{b}}.",
            f"{_C} whichever of {{a}} and {{b}} is bigger.",
            f"{_D} max({{a}}, {{b}}).",
        ),
        "max({a}, {b})",
        _PAIRS,
    ),
    _t(
        "is_even",
        "conditionals",
        "int",
        "is_even even check_even even_number is_pair divisible_by_two evenness is_even_num",
        (
            f"{_W} True if {{a}} is even and False otherwise.",
            f"{_C} whether {{a}} is divisible by 2, as True or False.",
            f"{_D} {{a}} % 2 == 0.",
        ),
        "{a} % 2 == 0",
        ((3,), (4,), (0,), (-7,)),
    ),
    _t(
        "clamp",
        "conditionals",
        "int",
        "cap_{w} at_most_{w} clamp_{w} limit_{w} cap clamp ceiling limit",
        (
            f"{_W} {{a}}, but never more than {{k}}.",
            f"{_C} {{a}} clamped so it is at most {{k}}.",
            f"{_D} min({{a}}, {{k}}).",
        ),
        "min({a}, {k})",
        ((5,), (-4,), (12,), (3,)),
        range(0, 10),
    ),
    _t(
        "sign",
        "conditionals",
        "int",
        "sign signum sign_of direction polarity sgn get_sign which_side",
        (
            f"{_W} 1 if {{a}} is positive, -1 if it is negative and 0 if it is zero.",
            f"{_C} the sign of {{a}}: 1, -1 or 0.",
            f"{_D} ({{a}} > 0) - ({{a}} < 0).",
        ),
        "({a} > 0) - ({a} < 0)",
        ((-5,), (0,), (8,), (-1,)),
    ),
    _t(
        "is_multiple",
        "conditionals",
        "int",
        "is_multiple_of_{w} divisible_by_{w} multiple_of_{w} fits_{w} divides check_multiple "
        "is_multiple splits_evenly",
        (
            f"{_W} True if {{a}} is divisible by {{k}} and False otherwise.",
            f"{_C} whether {{a}} is a multiple of {{k}}, as True or False.",
            f"{_D} {{a}} % {{k}} == 0.",
        ),
        "{a} % {k} == 0",
        ((6,), (0,), (35,), (18,)),
        range(3, 10),  # 2 is is_even
    ),
)
"""The operation templates, grouped by domain."""
_TEMPLATES_BY_KEY = {t.key: t for t in TEMPLATES}


@dataclass(frozen=True)
class Variant:
    """One generated task before it is written: every choice that shapes it."""

    template: Template
    name: str
    args: str
    const: int | str | None
    phrasing: int
    drawn: bool = False
    """Inputs drawn per task (``INPUT_MODES``)."""
    gold: bool = True
    """Whether the task folder carries its gold solution; without it no gold trajectory of
    the task exists anywhere, and only RL's own attempts can learn it."""
    kinded: bool = False
    """A made-up word's sentence names the argument's kind (``phrasings="kinds"``)."""

    @property
    def key(self) -> tuple[str, str, str]:
        """The split unit: (template, function name, constant); with the fixed name,
        (template, argument names, constant)."""
        if self.name == FIXED_NAME:
            return (self.template.key, f"args={self.args}", repr(self.const))
        return (self.template.key, self.name, repr(self.const))

    @property
    def task_id(self) -> str:
        raw = f"v{GENERATOR_VERSION}|{self.key}|{self.args}|{self.phrasing}"
        raw += "|drawn" * self.drawn + "|nogold" * (not self.gold) + "|kinded" * self.kinded
        return f"nano-{self.template.key.replace('_', '-')}-{_digest(raw)[:10]}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _rank(key: tuple[str, str, str]) -> str:
    return _digest(f"nano-split-v{GENERATOR_VERSION}|{'|'.join(key)}")


@functools.cache
def heldout_keys() -> frozenset[tuple[str, str, str]]:
    """The variant keys of the ``heldout`` split: per template, the ``HELDOUT_PERCENT``
    (at least one) with the lowest stable hash, so every template is in both splits."""
    out = set()
    for t in TEMPLATES:
        for names in NAME_MODES:
            keys = sorted({v.key for v in _template_variants(t, names)}, key=_rank)
            out.update(keys[: max(1, round(len(keys) * HELDOUT_PERCENT / 100))])
    return frozenset(out)


def split_of(key: tuple[str, str, str]) -> str:
    """``train`` or ``heldout`` for a variant key (template, function name, constant)."""
    return "heldout" if key in heldout_keys() else "train"


@functools.cache
def validation_keys() -> frozenset[tuple[str, str, str]]:
    """The variant keys of the ``validation`` split (``TUNING_SPLITS``), all in ``train``."""
    out = set()
    for t in TEMPLATES:
        for names in NAME_MODES:
            keys = {v.key for v in _template_variants(t, names)}
            keys = sorted((k for k in keys if split_of(k) == "train"), key=_rank)
            out.update(keys[: max(1, round(len(keys) * HELDOUT_PERCENT / 100))])
    return frozenset(out)


HOLDOUT_MODES = ("pairs", "names")
"""How ``heldout`` (and ``validation``) are cut with the fixed function name: ``pairs``,
per template the variant keys (template, argument names, constant) of lowest stable hash,
so a held-out task pairs an operation with an argument name that trains with other
operations (a name then hints which operations it never went with); ``names``, per
argument kind the ``HELDOUT_PERCENT`` of the ``_ARGS`` names (at least one) of lowest
stable hash, then as many again for ``validation``: those names appear in no training
task at all, so a held-out name is new text that says nothing about the operation."""


@functools.cache
def held_names() -> dict[str, dict[str, frozenset[str]]]:
    """``holdout="names"``: per argument kind, the ``heldout`` and ``validation`` names."""
    out: dict[str, dict[str, frozenset[str]]] = {"heldout": {}, "validation": {}}
    for kind, names in _ARGS.items():
        ranked = sorted(names, key=lambda a: _digest(f"nano-names-v{GENERATOR_VERSION}|{a}"))
        n = max(1, round(len(names) * HELDOUT_PERCENT / 100))
        out["heldout"][kind] = frozenset(ranked[:n])
        out["validation"][kind] = frozenset(ranked[n : 2 * n])
    return out


def in_split(key: tuple[str, str, str], split: str, holdout: str = "pairs") -> bool:
    """Whether a variant key belongs to ``split`` (one of ``SPLITS + TUNING_SPLITS``),
    cut the ``holdout`` way (``HOLDOUT_MODES``; ``names`` needs the fixed function name)."""
    if holdout == "names":
        kind = _TEMPLATES_BY_KEY[key[0]].kind
        if not key[1].startswith("args="):
            raise ValueError('holdout="names" needs names="fixed" (the argument is the key)')
        args = key[1][len("args=") :]
        held = held_names()
        if split == "heldout":
            return args in held["heldout"][kind]
        if split == "validation":
            return args in held["validation"][kind]
        outside = args not in held["heldout"][kind]
        return outside and (split == "train" or args not in held["validation"][kind])
    if split in SPLITS:
        return split_of(key) == split
    if split == "validation":
        return key in validation_keys()
    return split_of(key) == "train" and key not in validation_keys()


def all_variants(
    names: str = "varied", arg_names: str = "standard", phrasings: str = "all"
) -> list[Variant]:
    """Every variant of every template, in a fixed order."""
    for value, modes, what in (
        (names, NAME_MODES, "names"),
        (arg_names, ARG_MODES, "arg_names"),
        (phrasings, PHRASING_MODES, "phrasings"),
    ):
        if value not in modes:
            raise ValueError(f"{what} must be one of {modes}, got {value!r}")
    return [v for t in TEMPLATES for v in _template_variants(t, names, arg_names, phrasings)]


def word_phrasings(t: Template) -> tuple[int, ...]:
    """Indices of ``t``'s phrasings that do not state its returned expression (with the
    argument named ``zq`` and the template's first constant)."""
    k = t.consts[0]
    fill = {"a": "zq", "b": "zq", "k": "" if k is None else k}
    body = t.body.format(**fill)
    return tuple(
        i
        for i, text in enumerate(t.phrasings)
        if body not in text.format(sig="solve(zq)", f="solve", **fill)
    )


def coined_word(t: Template) -> str:
    """The made-up word the ``coined`` phrasing names ``t``'s operation by: five letters,
    consonant-vowel alternating, drawn from a digest of the template's key; distinct for
    every template and no argument name."""
    return _coined_words()[t.key]


def decoy_words(t: Template) -> tuple[str, ...]:
    """The ``DECOYS`` made-up words the ``decoys`` phrasings name ``t``'s operation by
    (with gold, in training only); made like :func:`coined_word`, distinct from every
    coined word, every other decoy and every argument name."""
    return _made_up_words()[1][t.key]


def vague_words(kind: str) -> tuple[str, ...]:
    """The made-up words the ``vague`` phrasings use for the operations of argument
    ``kind``: ``DECOYS`` per template of that kind, distinct from every coined word, decoy
    and argument name (see :func:`vague_word`)."""
    return _made_up_words()[2][kind]


def vague_word(t: Template, args: str, j: int) -> str:
    """The word of ``t``'s ``j``-th vague phrasing with arguments ``args``. Over argument
    names a word names every operation of the kind (the operation's rank among its kind's
    templates plus the argument's rank among the kind's names, modulo the templates); for
    one argument name each (operation, phrasing) has its own word, so no two tasks share a
    spec and ask for different code."""
    same = [u.key for u in TEMPLATES if u.kind == t.kind]
    pool = _ARGS[t.kind] + _WIDE_ARGS[t.kind]
    shift = (same.index(t.key) + pool.index(args)) % len(same)
    return vague_words(t.kind)[shift * DECOYS + j]


def _coined_words() -> dict[str, str]:
    return _made_up_words()[0]


def made_up_words() -> tuple[str, ...]:
    """Every made-up word of the nano phrasings (coined, decoy and vague), sorted: what a
    tokenizer keeps whole for them (``model.words = "nano"`` of ``gyre train``)."""
    coined, decoys, vague = _made_up_words()
    words = set(coined.values())
    for table in (decoys, vague):
        for ws in table.values():
            words.update(ws)
    return tuple(sorted(words))


@functools.cache
def _made_up_words() -> tuple[
    dict[str, str], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]
]:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    taken = {a for pool in (*_ARGS.values(), *_WIDE_ARGS.values()) for a in pool}

    def draw(tag: str) -> str:
        for salt in range(100):
            h = int(_digest(f"{tag}|{salt}"), 16)
            word = ""
            for i in range(5):
                pool = vowels if i % 2 else consonants
                word += pool[h % len(pool)]
                h //= len(pool)
            if word not in taken:
                taken.add(word)
                return word
        raise AssertionError(f"no made-up word free for {tag!r}")

    coined = {t.key: draw(f"nano-coined|{t.key}") for t in TEMPLATES}
    decoys = {
        t.key: tuple(draw(f"nano-decoy|{t.key}|{i}") for i in range(DECOYS)) for t in TEMPLATES
    }
    per_kind = collections.Counter(t.kind for t in TEMPLATES)  # in first-seen order
    vague = {
        k: tuple(draw(f"nano-vague|{k}|{i}") for i in range(DECOYS * n))
        for k, n in per_kind.items()
    }
    return coined, decoys, vague


def phrasing_indices(t: Template, phrasings: str) -> tuple[int, ...]:
    """``t``'s phrasings in a ``PHRASING_MODES`` mode, as indices; the coined one is
    ``len(t.phrasings)``, the decoys the ``DECOYS`` after it, the vague words the
    ``DECOYS`` after those (see :func:`phrasing_text`)."""
    if phrasings == "all":
        return tuple(range(len(t.phrasings)))
    n = len(t.phrasings)
    if phrasings in ("words", "coined"):
        return word_phrasings(t) + ((n,) if phrasings == "coined" else ())
    first = n + 1 if phrasings == "decoys" else n + 1 + DECOYS  # vague, kinds
    return (*word_phrasings(t), n, *range(first, first + DECOYS))


def is_coined(t: Template, phrasing: int) -> bool:
    """Whether ``phrasing`` is ``t``'s coined one (the index past its own phrasings)."""
    return phrasing == len(t.phrasings)


def is_decoy(t: Template, phrasing: int) -> bool:
    """Whether ``phrasing`` is one of ``t``'s decoys or vague words (past its coined one)."""
    return phrasing > len(t.phrasings)


def phrasing_text(t: Template, phrasing: int, args: str | None = None, kinded: bool = False) -> str:
    """The spec sentence of ``t``'s ``phrasing`` (with ``{sig}``, ``{a}``, ... unfilled);
    a vague phrasing's word depends on the arguments ``args`` as well. ``kinded``: a
    made-up word's sentence names the argument's kind (``KIND_NOUNS``)."""
    n = len(t.phrasings)
    if phrasing < n:
        return t.phrasings[phrasing]
    if phrasing == n:
        word = coined_word(t)
    elif phrasing <= n + DECOYS:
        word = decoy_words(t)[phrasing - n - 1]
    else:
        if args is None:
            raise ValueError("a vague phrasing's word depends on the argument names")
        word = vague_word(t, args, phrasing - n - 1 - DECOYS)
    of = "{a} and {b}" if t.kind == "pair" else "{a}"
    if kinded:
        of = f"the {KIND_NOUNS[t.kind]} {of}"
    with_k = " with {k}" if "{k}" in t.body else ""
    return f"{_W} the {word} of {of}{with_k}."


def _template_variants(
    t: Template, names: str = "varied", arg_names: str = "standard", phrasings: str = "all"
) -> list[Variant]:
    arg_pool = _ARGS[t.kind] + (_WIDE_ARGS[t.kind] if arg_names == "wide" else ())
    wording = phrasing_indices(t, phrasings)
    out = []
    for const in t.consts:
        word = _DIGITS[const] if isinstance(const, int) else const
        pool = [FIXED_NAME] if names == "fixed" else [n.format(w=word) for n in t.names]
        for name in dict.fromkeys(pool):
            for args in arg_pool:
                for phrasing in wording:
                    kinded = phrasings == "kinds" and phrasing >= len(t.phrasings)
                    out.append(Variant(t, name, args, const, phrasing, kinded=kinded))
    return out


_LETTERS = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"


def draw_inputs(t: Template, seed: str, fn=None) -> tuple[tuple, ...]:
    """Four argument tuples for ``t``, drawn from a generator seeded by ``seed`` (a task
    id), of the same kinds and ranges as the template's own inputs: strings mix upper
    and lower case (and, where the template's inputs have them, end in whitespace),
    lists are non-empty, integers are non-negative where the template's are. With the
    gold function ``fn``, the three value tests do not all expect the same output, so a
    constant answer (``return True``) does not pass."""
    rng = random.Random(f"nano-inputs|{seed}")
    nonneg = all(x >= 0 for args in t.inputs for x in args if isinstance(x, int))
    padded = any(a != a.strip() for args in t.inputs for a in args if isinstance(a, str))

    def one() -> tuple:
        if t.kind == "int":
            return (rng.randint(0, 40) if nonneg else rng.randint(-30, 30),)
        if t.kind == "pair":
            return (rng.randint(-20, 20), rng.randint(-20, 20))
        if t.kind == "list":
            return ([rng.randint(-9, 30) for _ in range(rng.randint(1, 6))],)
        text = rng.choice(_LETTERS.lower()) + rng.choice(_LETTERS.upper())
        text += "".join(rng.choice(_LETTERS) for _ in range(rng.randint(0, 4)))
        text = "".join(rng.sample(text, len(text)))
        if padded:
            text = rng.choice(" \t") * rng.randint(1, 2) + text + rng.choice(" \n")
        return (text,)

    for _ in range(100):
        out: list[tuple] = []
        while len(out) < 4:  # four different inputs
            args = one()
            if args not in out:
                out.append(args)
        if fn is None or len({repr(fn(*args)) for args in out[1:]}) > 1:
            break
    return tuple(out)


def render(v: Variant) -> dict[str, str]:
    """The files of a variant's task folder (relative path -> text)."""
    t = v.template
    names = [a.strip() for a in v.args.split(",")]
    fill = {"a": names[0], "b": names[-1], "k": "" if v.const is None else v.const}
    sig = f"{v.name}({v.args})"
    spec = phrasing_text(t, v.phrasing, v.args, v.kinded).format(sig=sig, f=v.name, **fill)
    gold = f"def {sig}:\n    return {t.body.format(**fill)}\n"
    scope: dict = {}
    exec(gold, scope)  # our own one-line gold: the expected values come from it
    fn = scope[v.name]
    inputs = draw_inputs(t, v.task_id, fn) if v.drawn else t.inputs
    want = [fn(*args) for args in inputs]
    calls = [f"{v.name}({', '.join(map(repr, args))})" for args in inputs]
    rtype = type(want[0]).__name__
    tests = [f"def test_returns_{rtype}():\n    assert type(solution.{calls[0]}) is {rtype}\n"]
    tests += [
        f"def test_value_{i}():\n    assert solution.{c} == {w!r}\n"
        for i, (c, w) in enumerate(zip(calls[1:], want[1:], strict=True), 1)
    ]
    toml = "\n".join(
        [
            f'id = "{v.task_id}"',
            f'title = "{sig}"',
            'tier = "nano"',
            f'domain = "{t.domain}"',
            f'test_commands = ["{_PYTEST} tests/test_solution.py"]',
            'hidden_tests = ["tests/test_solution.py"]',
            f'visible_test_commands = ["{_PYTEST} tests/test_visible.py"]',
            f"test_count = {len(tests)}",
            'remove_before_grading = ["tests", "conftest.py"]',
            "max_steps = 4",
            "wall_clock_s = 120",
            "grading_timeout_s = 30",
            "",
        ]
    )
    files = {
        "spec.md": spec + "\n",
        "task.toml": toml,
        "hidden_tests/tests/test_solution.py": "import solution\n\n\n" + "\n\n".join(tests),
        "visible_tests/tests/test_visible.py": (
            f"from solution import {v.name}\n\n\n"
            f"def test_example():\n    assert {calls[0]} == {want[0]!r}\n"
        ),
    }
    if v.gold:
        files["gold/solution.py"] = gold
    return files


def default_root() -> Path:
    """Where generated task folders live: ``cache_root()/tasks/nano``."""
    return cache_root() / "tasks" / "nano"


def materialise(v: Variant, root: Path) -> Path:
    """The task folder of ``v`` under ``root``, written atomically unless already there."""
    files = render(v)
    digest = _digest("\0".join(f"{k}\0{files[k]}" for k in sorted(files)))[:8]
    folder = root / f"{v.task_id}.{digest}"
    if (folder / "task.toml").is_file():
        return folder
    tmp = root / f".{folder.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    try:
        os.rename(tmp, folder)
    except OSError:  # another process got there first: its folder is identical
        shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / "task.toml").is_file():
            raise
    return folder


def select_templates(only: str | None) -> set[str]:
    """Template keys named by ``only``: comma-separated template keys and/or domains
    (``arithmetic``, ``strings``, ``lists``, ``conditionals``); None: all."""
    if only is None:
        return {t.key for t in TEMPLATES}
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    known = {t.key for t in TEMPLATES} | {t.domain for t in TEMPLATES}
    unknown = sorted(wanted - known)
    if unknown or not wanted:
        raise ValueError(f"unknown nano templates/domains {unknown}; known: {sorted(known)}")
    return {t.key for t in TEMPLATES if t.key in wanted or t.domain in wanted}


def sample_variants(
    split: str,
    count: int | None,
    seed: int,
    names: str = "varied",
    only: str | None = None,
    arg_names: str = "standard",
    inputs: str = "fixed",
    phrasings: str = "all",
    gold_only: str | None = None,
    holdout: str = "pairs",
    gold_phrasing: int | str | None = None,
) -> list[Variant]:
    """``count`` variants of ``split`` (all when None), round-robin over the templates in a
    seeded order, each template's variants in a seeded order: balanced and deterministic.
    The seeded order does not depend on ``arg_names``, so with fixed function names a
    held-out or validation draw is the same in both modes. ``inputs`` (``INPUT_MODES``)
    and ``phrasings`` (``PHRASING_MODES``) shape the tasks; ``gold_only`` names the
    templates (as ``only`` does) whose tasks carry gold, the others have none (None:
    all have gold); ``gold_phrasing`` (an index into a template's phrasings of this
    ``phrasings`` mode) keeps gold only on tasks of that phrasing, so the other phrasings
    have no gold trajectory anywhere (None: every phrasing has gold); ``"alternate"``
    gives the n-th kept template of each kind gold on phrasing ``n mod phrasings`` only,
    so that every phrasing's sentence is shown with gold on some operation while each
    operation has phrasings with no gold anywhere. ``holdout`` is a ``HOLDOUT_MODES``
    entry."""
    if inputs not in INPUT_MODES:
        raise ValueError(f"inputs must be one of {INPUT_MODES}, got {inputs!r}")
    if holdout not in HOLDOUT_MODES:
        raise ValueError(f"holdout must be one of {HOLDOUT_MODES}, got {holdout!r}")
    if holdout == "names" and names != "fixed":
        raise ValueError('holdout="names" needs names="fixed" (the argument is the key)')
    if split not in SPLITS + TUNING_SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS + TUNING_SPLITS}")
    rng = random.Random(f"nano|{split}|{seed}" + ("" if names == "varied" else f"|{names}"))
    pools: dict[str, list[Variant]] = {}
    keep = select_templates(only)
    with_gold = select_templates(gold_only)
    if isinstance(gold_phrasing, str) and gold_phrasing != "alternate":
        gold_phrasing = int(gold_phrasing)  # "0" from ``gyre tasks -o``
    nth: dict[str, int] = {}  # "alternate": the template's rank among its kind's kept ones
    kept_of_kind: collections.Counter[str] = collections.Counter()
    for t in TEMPLATES:
        if t.key in keep:
            nth[t.key] = kept_of_kind[t.kind]
            kept_of_kind[t.kind] += 1
    for v in all_variants(names, arg_names, phrasings):
        if v.template.key in keep and in_split(v.key, split, holdout):
            if is_decoy(v.template, v.phrasing) and split not in ("train", "fit"):
                continue  # decoys teach in training; held-out and validation never show them
            wording = phrasing_indices(v.template, phrasings)
            index = gold_phrasing
            if gold_phrasing == "alternate":
                index = nth[v.template.key] % len(wording)
            elif gold_phrasing is not None and not 0 <= gold_phrasing < len(wording):
                raise ValueError(
                    f"gold_phrasing {gold_phrasing} is not one of the {len(wording)} "
                    f"phrasings of {v.template.key!r}"
                )
            gold = v.template.key in with_gold and (index is None or v.phrasing == wording[index])
            gold = gold and not is_coined(v.template, v.phrasing)  # shown only by grades
            v = dataclasses.replace(v, drawn=inputs == "drawn", gold=gold)
            pools.setdefault(v.template.key, []).append(v)
    for pool in pools.values():
        rng.shuffle(pool)
    available = sum(len(p) for p in pools.values())
    if count is None:
        count = available
    if not 0 < count <= available:
        raise ValueError(f"count must be in 1..{available} for split {split!r}, got {count}")
    order = sorted(pools)
    rng.shuffle(order)
    chosen: list[Variant] = []
    depth = 0
    while len(chosen) < count:
        for key in order:
            if depth < len(pools[key]) and len(chosen) < count:
                chosen.append(pools[key][depth])
        depth += 1
    return chosen


def fit_size(seed: int | str = 0, **options) -> int:
    """How many variants the ``fit`` split holds for these ``nano_tasks`` options."""
    return len(sample_variants("fit", None, int(seed), **options))


def nano_tasks(
    split: str = "train",
    count: int | str | None = 256,
    seed: int | str = 0,
    root: str | Path | None = None,
    names: str = "varied",
    only: str | None = None,
    arg_names: str = "standard",
    inputs: str = "fixed",
    phrasings: str = "all",
    gold_only: str | None = None,
    holdout: str = "pairs",
    gold_phrasing: int | str | None = None,
) -> list[Task]:
    """``count`` nano tasks of ``split`` for ``seed``, as loaded task folders (sorted by id).

    ``root`` is where the folders are written (default ``default_root()``); ``names`` is
    a ``NAME_MODES`` entry; ``only`` restricts the templates (``select_templates``);
    ``arg_names`` is an ``ARG_MODES`` entry; ``inputs``, ``phrasings``, ``gold_only``,
    ``holdout`` and ``gold_phrasing`` as in ``sample_variants``. String ``count`` and ``seed`` are accepted
    for ``gyre tasks -o count=32``.
    """
    count = None if count is None else int(count)
    variants = sample_variants(
        split,
        count,
        int(seed),
        names,
        only,
        arg_names,
        inputs,
        phrasings,
        gold_only,
        holdout,
        gold_phrasing,
    )
    base = Path(root).expanduser() if root is not None else default_root()
    base.mkdir(parents=True, exist_ok=True)
    tasks = [load_task(materialise(v, base)) for v in variants]
    return sorted(tasks, key=lambda t: t.id)
