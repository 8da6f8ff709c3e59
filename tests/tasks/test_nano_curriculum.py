"""The curriculum of the learning result (preset ``cpu-demo``): its held-out split tests
what training did not show, and no spec gives its answer away. Each property the
learning claim rests on is checked here on the preset's own task options."""

from __future__ import annotations

import collections
import re

import pytest

from gyre_env.scoring.final import GradingConfig, grade_workspace
from gyre_env.scoring.nano_baselines import answer, no_learning_baselines, template_of
from gyre_env.scoring.preflight import check_tasks
from gyre_env.tasks.nano import (
    TEMPLATES,
    draw_inputs,
    held_names,
    nano_tasks,
    render,
    sample_variants,
    word_phrasings,
)
from gyre_env.tasks.splits import split_gold
from gyre_env.train.config import load_config

PRESET = load_config(preset="cpu-demo")
PRESET_KW = dict(PRESET.tasks.suite_kwargs)
KW = {**PRESET_KW, "phrasings": "words"}
"""The preset's tasks with the sentences that describe an operation in words only (the
coined and made-up words are checked on their own, below)."""
ALL_OPS = set(KW["only"].split(","))
ONE_PHRASING = {**KW, "gold_phrasing": 0}
"""The preset's tasks with gold on the first phrasing of each operation only."""


def _has_gold(v) -> bool:
    return v.phrasing == word_phrasings(v.template)[0]


@pytest.fixture(scope="module")
def splits():
    return {s: sample_variants(s, None, 0, **KW) for s in ("train", "heldout", "fit", "validation")}


def _hidden(v) -> str:
    return render(v)["hidden_tests/tests/test_solution.py"]


def test_no_heldout_hidden_test_file_equals_a_training_tasks(splits):
    train = {_hidden(v) for v in splits["train"]}
    held = [_hidden(v) for v in splits["heldout"]]
    assert len(set(held)) == len(held)  # not even two held-out tasks share one
    assert not train & set(held)
    assert len(train) == len(splits["train"])  # inputs are drawn per task


def test_heldout_argument_names_appear_in_no_training_task(splits):
    train_names = {v.args for v in splits["train"]}
    held = {v.args for v in splits["heldout"]}
    assert held and not held & train_names
    assert held == {a for kind in held_names()["heldout"].values() for a in kind} - {"p, q"}
    # validation is cut from train the same way, and fit never sees its names
    assert not {v.args for v in splits["validation"]} & {v.args for v in splits["fit"]}


def test_every_operation_is_in_heldout_with_gold_and_every_phrasing(splits):
    held = splits["heldout"]
    assert {v.template.key for v in held} == ALL_OPS
    assert all(v.gold for v in splits["train"] + held)
    for key in ALL_OPS:
        t = next(t for t in TEMPLATES if t.key == key)
        assert {v.phrasing for v in held if v.template is t} == set(word_phrasings(t))


def test_the_presets_heldout_holds_coined_words_no_gold_shows():
    """The preset's curriculum (``phrasings="kinds"``): held-out is every operation with
    each held-out name in its two word sentences and its coined word's; no held-out
    hidden-test file or argument name is a training task's; no coined word has gold in
    any split, and training holds every coined word (RL's attempts can learn it)."""
    from gyre_env.tasks.nano import coined_word, is_coined, phrasing_indices

    assert PRESET_KW["phrasings"] == "kinds"
    train = sample_variants("train", None, 0, **PRESET_KW)
    held = sample_variants("heldout", None, 0, **PRESET_KW)
    assert len(held) == PRESET.tasks.heldout_count and len(train) == PRESET.tasks.train_count
    assert not {_hidden(v) for v in train} & {_hidden(v) for v in held}
    assert not {v.args for v in train} & {v.args for v in held}
    for key in ALL_OPS:
        t = next(t for t in TEMPLATES if t.key == key)
        mine = [v for v in held if v.template is t]
        assert {v.phrasing for v in mine} == set(phrasing_indices(t, "coined")), key
        coined = [v for v in train + held if v.template is t and is_coined(t, v.phrasing)]
        assert coined and not any(v.gold or "gold/solution.py" in render(v) for v in coined)
        assert {v.args for v in coined} & {v.args for v in train}, key  # RL meets the word
        assert all(coined_word(t) in render(v)["spec.md"] for v in coined)


def test_gold_phrasing_leaves_the_other_phrasings_without_gold_anywhere():
    train = sample_variants("train", None, 0, **ONE_PHRASING)
    held = sample_variants("heldout", None, 0, **ONE_PHRASING)
    assert {_has_gold(v) for v in held} == {True, False}  # both kinds are measured
    for v in train + held:
        assert ("gold/solution.py" in render(v)) == _has_gold(v) == v.gold, v.task_id


def test_sft_gold_comes_only_from_the_gold_phrasing(tmp_path):
    train = nano_tasks("train", 200, seed=0, root=tmp_path, **ONE_PHRASING)
    gold, rl = split_gold(train, gold_count=64, seed=0, rl_includes_gold=False)
    assert len(gold) == 64 and {template_of(t).key for t in gold} == ALL_OPS
    assert all(t.gold_dir for t in gold)
    no_gold = [t for t in rl if t.gold_dir is None]
    assert {template_of(t).key for t in no_gold} == ALL_OPS  # RL sees the other phrasing


def test_alternate_gold_shows_every_phrasing_and_leaves_every_operation_one_without_gold():
    kw = {**KW, "gold_phrasing": "alternate"}
    for split in ("train", "heldout"):
        variants = sample_variants(split, None, 0, **kw)
        pairs = {
            (v.template.key, word_phrasings(v.template).index(v.phrasing), v.gold) for v in variants
        }
        for key in ALL_OPS:  # one phrasing with gold, the other with none anywhere
            assert {g for k, _, g in pairs if k == key} == {True, False}, key
            assert len({p for k, p, g in pairs if k == key and g}) == 1, key
        for kind in ("str", "list", "int"):  # each phrasing's sentence is shown with gold
            ops = {t.key for t in TEMPLATES if t.kind == kind} & ALL_OPS
            assert {p for k, p, g in pairs if k in ops and g} == {0, 1}, kind
        for v in variants:
            assert ("gold/solution.py" in render(v)) == v.gold, v.task_id

    # the same draw as without gold_phrasing: only which tasks carry gold differs
    def what(v):
        return v.template.key, v.args, v.phrasing

    assert [what(v) for v in sample_variants("train", None, 0, **kw)] == [
        what(v) for v in sample_variants("train", None, 0, **KW)
    ]


def test_gold_only_leaves_whole_operations_without_gold(tmp_path):
    kw = {**KW, "gold_only": "upper,sum"}
    for v in sample_variants("train", 100, 0, **kw):
        assert v.gold == (v.template.key in ("upper", "sum"))
    with pytest.raises(ValueError, match="gold_phrasing 5"):
        sample_variants("train", 10, 0, **{**KW, "gold_phrasing": 5})


def test_no_spec_states_its_answer():
    preset = [v for s in ("train", "heldout") for v in sample_variants(s, None, 0, **PRESET_KW)]
    for v in preset:
        files = render(v)
        names = [a.strip() for a in v.args.split(",")]
        body = v.template.body.format(a=names[0], b=names[-1], k="")
        assert body not in files["spec.md"], (files["spec.md"], body)
    for t in TEMPLATES:  # the words phrasings drop exactly the ones that state the body
        assert 0 < len(word_phrasings(t)) < len(t.phrasings), t.key


def _gold_fn(t):
    fill = {"a": "a", "b": "b", "k": "" if t.consts[0] is None else t.consts[0]}
    scope: dict = {}
    args = "a, b" if t.kind == "pair" else "a"
    exec(f"def f({args}):\n    return {t.body.format(**fill)}\n", scope)
    return scope["f"]


def test_drawn_inputs_differ_per_task_and_defeat_a_constant_answer():
    for t in TEMPLATES:
        fn = _gold_fn(t)
        a, b = draw_inputs(t, "task-1", fn), draw_inputs(t, "task-2", fn)
        assert a != b and len(set(map(repr, a))) == 4
        assert len({repr(fn(*x)) for x in a[1:]}) > 1, t.key
        assert draw_inputs(t, "task-1", fn) == a  # deterministic


@pytest.mark.slow
def test_heldout_tasks_pass_with_gold_and_fail_empty(tmp_path):
    """The real preflight over held-out tasks of gold operations (gold 1.0, empty 0.0),
    and tasks without gold graded with their operation's answer and another one."""
    held = nano_tasks("heldout", 32, seed=0, root=tmp_path, **ONE_PHRASING)
    with_gold = [t for t in held if t.gold_dir][:3]
    results = check_tasks(with_gold)
    assert all(r.ok and r.gold.score == 1.0 and r.empty.score == 0.0 for r in results)
    local = GradingConfig(backend="local", pytest_plugins=[])  # the host's plugins: 4 s a run
    for task in [t for t in held if not t.gold_dir][:3]:
        mine = template_of(task)
        other = next(t for t in TEMPLATES if t.kind == mine.kind and t.key != mine.key)
        for op, want in ((mine, 1.0), (other, None)):
            ws = tmp_path / f"ws-{task.id}-{op.key}"
            ws.mkdir()
            (ws / "solution.py").write_text(answer(task, op))
            score = grade_workspace(task, ws, local).score
            assert score == want if want is not None else score < 1.0, (task.id, op.key)


@pytest.mark.slow
def test_no_learning_baselines_are_graded_on_the_tasks(tmp_path):
    """Upper-case/lower-case/reverse tasks: a guess among the three string operations
    passes one in three; the majority op passes only its own operation's tasks."""
    kw = {**KW, "only": "upper,lower,reverse,sum", "gold_only": "upper"}
    held = nano_tasks("heldout", 4, seed=0, root=tmp_path, **kw)  # one per operation
    train = nano_tasks("train", 60, seed=0, root=tmp_path, **kw)
    local = GradingConfig(backend="local", pytest_plugins=[])  # the host's plugins: 4 s a run
    found = no_learning_baselines(held, train, local, parallel=2)
    strs = [t for t in held if template_of(t).kind == "str"]
    assert strs and all(abs(found["type-guess"][t.id] - 1 / 3) < 1e-9 for t in strs)
    lists = [t for t in held if template_of(t).kind == "list"]
    assert lists and all(found["type-guess"][t.id] == 1.0 for t in lists)  # sum alone
    majority = {template_of(t).key for t in held if found["majority-op"][t.id] == 1.0}
    assert len(majority) == 1
    best = found["best-op-per-kind"]
    assert sum(best[t.id] for t in strs) == max(
        sum(template_of(t).key == k for t in strs) for k in ("upper", "lower", "reverse")
    )
    assert re.fullmatch(
        r"def solve\(\w+\):\n    return .+\n", answer(held[0], template_of(held[0]))
    )


def test_a_coined_word_is_shown_by_grades_alone():
    """``phrasings="coined"``: one more phrasing per operation names it by a word made up
    for it. No task of that phrasing carries gold, in any split; the training split has
    such tasks for every operation (RL's attempts can learn the word) and held-out has
    them with its own names; the word is distinct per operation, no argument name, and no
    spec of it states the answer."""
    from gyre_env.tasks.nano import coined_word, is_coined, phrasing_text

    kw = {**KW, "phrasings": "coined"}
    words = [coined_word(t) for t in TEMPLATES]
    assert len(set(words)) == len(TEMPLATES) and all(re.fullmatch(r"[a-z]{5}", w) for w in words)
    for split in ("train", "heldout", "validation"):
        variants = sample_variants(split, None, 0, **kw)
        coined = [v for v in variants if is_coined(v.template, v.phrasing)]
        assert {v.template.key for v in coined} == ALL_OPS, split
        assert not any(v.gold for v in coined), split
        for v in coined:
            files = render(v)
            spec, names = files["spec.md"], [a.strip() for a in v.args.split(",")]
            assert coined_word(v.template) in spec and "gold/solution.py" not in files
            k = "" if v.const is None else v.const
            assert v.template.body.format(a=names[0], b=names[-1], k=k) not in spec
    # the words mode is untouched: the same tasks as without the coined phrasing
    words_only = {v.task_id for v in sample_variants("train", None, 0, **KW)}
    with_coined = sample_variants("train", None, 0, **kw)
    assert words_only == {v.task_id for v in with_coined if not is_coined(v.template, v.phrasing)}
    upper = next(t for t in TEMPLATES if t.key == "upper")
    assert phrasing_text(upper, len(upper.phrasings)).endswith(
        f"the {coined_word(upper)} of {{a}}."
    )


def test_kinds_name_the_argument_kind_in_every_made_up_word_sentence():
    """``phrasings="kinds"``: the vague mode's tasks, each made-up word's sentence (the
    coined word's and the vague words') naming the argument's kind, so that a coined word
    asks for one of its kind's operations. The sentences that describe an operation in
    words are the vague mode's own; the coined word still has no gold in any split, and
    held-out and validation hold the same (operation, argument, phrasing) tasks as there."""
    from gyre_env.tasks.nano import KIND_NOUNS, coined_word, is_coined, is_decoy

    def shape(v):
        return (v.template.key, v.args, v.phrasing, v.gold)

    kinds, vague = {**KW, "phrasings": "kinds"}, {**KW, "phrasings": "vague"}
    for split in ("train", "fit", "heldout", "validation"):
        ours, theirs = (
            sample_variants(split, None, 0, **kinds),
            sample_variants(split, None, 0, **vague),
        )
        assert sorted(map(shape, ours)) == sorted(map(shape, theirs)), split
        for v in ours:
            t, spec = v.template, render(v)["spec.md"]
            names = [a.strip() for a in v.args.split(",")]
            made_up = is_coined(t, v.phrasing) or is_decoy(t, v.phrasing)
            assert v.kinded == made_up
            noun = f"of the {KIND_NOUNS[t.kind]} {names[0]}"
            assert noun in spec or not made_up, spec
            if is_coined(t, v.phrasing):
                assert not v.gold and f"the {coined_word(t)} of the " in spec
                k = "" if v.const is None else v.const
                assert t.body.format(a=names[0], b=names[-1], k=k) not in spec
        same = {v.task_id for v in theirs if not (v.phrasing >= len(v.template.phrasings))}
        assert same <= {v.task_id for v in ours}, split  # word sentences: the same tasks


@pytest.mark.parametrize("mode", ["decoys", "vague"])
def test_decoy_words_teach_in_training_only_and_never_the_coined_word(mode):
    """``phrasings="decoys"``: the coined phrasing as before, and ``DECOYS`` more per
    operation naming it by other made-up words, with gold, in ``train`` and ``fit`` only;
    ``"vague"``: the same with words per argument kind, each naming every operation of the
    kind in some gold task. Held-out and validation are the coined mode's tasks exactly;
    the coined word still has no gold anywhere, and no decoy is a coined word or an
    argument name."""
    from gyre_env.tasks.nano import (
        _ARGS,
        _WIDE_ARGS,
        DECOYS,
        coined_word,
        decoy_words,
        is_coined,
        is_decoy,
        vague_words,
    )

    coined = {coined_word(t) for t in TEMPLATES}
    kinds = sorted({t.kind for t in TEMPLATES})
    decoys = [w for t in TEMPLATES for w in decoy_words(t)]
    decoys += [w for k in kinds for w in vague_words(k)]
    args = {a for pool in (*_ARGS.values(), *_WIDE_ARGS.values()) for a in pool}
    # decoys: DECOYS per template; vague: DECOYS per template of a kind, so as many again
    assert len(set(decoys)) == len(decoys) == 2 * DECOYS * len(TEMPLATES)
    assert not (set(decoys) & coined) and not (set(decoys) & args)
    assert all(re.fullmatch(r"[a-z]{5}", w) for w in decoys)
    kw = {**KW, "phrasings": mode}
    words = {t.key: vague_words(t.kind) if mode == "vague" else decoy_words(t) for t in TEMPLATES}
    for split in ("heldout", "validation"):
        with_decoys = {v.task_id for v in sample_variants(split, None, 0, **kw)}
        coined_mode = {
            v.task_id for v in sample_variants(split, None, 0, **{**KW, "phrasings": "coined"})
        }
        assert with_decoys == coined_mode, split
    for split in ("train", "fit"):
        variants = sample_variants(split, None, 0, **kw)
        shown = [v for v in variants if is_decoy(v.template, v.phrasing)]
        assert {v.template.key for v in shown} == ALL_OPS, split
        assert all(v.gold for v in shown), split
        assert not any(v.gold for v in variants if is_coined(v.template, v.phrasing)), split
        spec_of = {v.task_id: render(v)["spec.md"] for v in variants}
        specs = collections.defaultdict(set)  # gold replays a task by its spec: one code each
        for v in variants:
            specs[spec_of[v.task_id]].add(v.template.key)
        assert all(len(ops) == 1 for ops in specs.values()), split
        named = collections.defaultdict(set)  # word -> the operations it names in gold
        for v in shown:
            spec = spec_of[v.task_id]
            word = next(w for w in words[v.template.key] if f"the {w} of" in spec)
            assert not any(w in spec for w in coined), spec
            named[word].add(v.template.key)
        for word, ops in named.items():
            if mode == "decoys":
                assert len(ops) == 1, (split, word, ops)
                continue
            kind = next(t.kind for t in TEMPLATES if t.key in ops)
            assert ops == {t.key for t in TEMPLATES if t.kind == kind} & ALL_OPS, (split, word)
