"""The generated ``nano`` tier: determinism, disjoint splits, size, and a real preflight
(gold scores 1.0, an empty workspace 0.0) over one task per template."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from gyre_env.scoring.preflight import check_tasks, run_preflight
from gyre_env.tasks import load_suite, load_task, nano_tasks
from gyre_env.tasks.nano import (
    SPLITS,
    TEMPLATES,
    TUNING_SPLITS,
    all_variants,
    in_split,
    materialise,
    render,
    sample_variants,
    split_of,
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("nano")


def _ids(tasks):
    return [t.id for t in tasks]


def test_same_seed_same_tasks_other_seed_other_tasks(root, tmp_path):
    a = nano_tasks("train", 64, seed=3, root=root)
    b = nano_tasks("train", 64, seed=3, root=tmp_path)  # fresh folder: same content
    assert _ids(a) == _ids(b) and len(set(_ids(a))) == 64
    assert [t.spec for t in a] == [t.spec for t in b]
    assert [(t.gold_dir / "solution.py").read_text() for t in a] == [
        (t.gold_dir / "solution.py").read_text() for t in b
    ]
    assert _ids(nano_tasks("train", 64, seed=4, root=root)) != _ids(a)
    assert set(_ids(nano_tasks("train", 16, seed=3, root=root))) <= set(_ids(a))


def test_splits_are_disjoint_by_variant_not_only_by_id():
    by_split = {s: [v for v in all_variants() if split_of(v.key) == s] for s in SPLITS}
    train_keys = {v.key for v in by_split["train"]}
    heldout_keys = {v.key for v in by_split["heldout"]}
    assert not train_keys & heldout_keys
    # The (template, function name, constant) pairings differ, so do the specs and golds.
    assert not {render(v)["spec.md"] for v in by_split["train"]} & {
        render(v)["spec.md"] for v in by_split["heldout"]
    }
    assert not {render(v)["gold/solution.py"] for v in by_split["train"]} & {
        render(v)["gold/solution.py"] for v in by_split["heldout"]
    }
    share = len(heldout_keys) / (len(train_keys) + len(heldout_keys))
    assert 0.15 < share < 0.3
    for t in TEMPLATES:  # every template is in both splits
        assert {split_of(v.key) for v in all_variants() if v.template is t} == set(SPLITS)
    drawn = {s: sample_variants(s, None, seed=0) for s in SPLITS}
    assert not {v.key for v in drawn["train"]} & {v.key for v in drawn["heldout"]}


def test_validation_and_fit_partition_the_train_split_like_heldout_is_cut():
    for names in ("varied", "fixed"):
        keys = {v.key for v in all_variants(names)}
        part = {s: {k for k in keys if in_split(k, s)} for s in SPLITS + TUNING_SPLITS}
        assert part["fit"] | part["validation"] == part["train"]
        assert not part["fit"] & part["validation"] and not part["validation"] & part["heldout"]
        assert 0.15 < len(part["validation"]) / len(part["train"]) < 0.3
        for t in TEMPLATES:  # every template validates and fits
            mine = {s: {k for k in part[s] if k[0] == t.key} for s in TUNING_SPLITS}
            assert all(mine.values()), (t.key, names)
    drawn = {s: {v.key for v in sample_variants(s, None, seed=0)} for s in TUNING_SPLITS}
    assert not drawn["fit"] & drawn["validation"]


def test_thousands_of_variants_many_templates_balanced_draws():
    variants = all_variants()
    ids = [v.task_id for v in variants]
    assert len(set(ids)) == len(ids) > 5000
    specs = [render(v)["spec.md"] for v in variants]
    assert len(set(specs)) == len(specs)  # no two variants (of any templates) coincide
    assert len({v.key for v in variants}) > 500
    assert len(TEMPLATES) >= 20 and len({t.key for t in TEMPLATES}) == len(TEMPLATES)
    assert {t.domain for t in TEMPLATES} == {"arithmetic", "strings", "lists", "conditionals"}
    assert len(sample_variants("heldout", None, seed=0)) > 1000
    per_template = Counter(v.template.key for v in sample_variants("train", 250, seed=0))
    assert len(per_template) == len(TEMPLATES) and set(per_template.values()) == {10}
    with pytest.raises(ValueError, match="count must be in"):
        sample_variants("train", 10**6, seed=0)
    with pytest.raises(ValueError, match="split"):
        sample_variants("test", 4, seed=0)


def test_tasks_are_tiny_and_shaped_for_the_env(root):
    for task in nano_tasks("train", 50, seed=0, root=root):
        assert task.tier == "nano" and task.id.startswith("nano-")
        assert task.test_count == 4 and task.max_steps <= 6 and task.wall_clock_s <= 120
        assert task.spec.count(".") <= 6 and len(task.spec) < 200, task.spec
        gold = (task.gold_dir / "solution.py").read_text()
        lines = gold.splitlines()
        assert (
            len(lines) == 2 and lines[0].startswith("def ") and lines[1].startswith("    return ")
        )
        assert lines[0][4:-1] in task.spec  # the signature is stated
        assert task.visible_test_paths == ["tests/test_visible.py"]
        assert "tests" in task.remove_before_grading


def test_generation_is_fast_and_reuses_folders(tmp_path):
    start = time.monotonic()
    tasks = nano_tasks("train", 2000, seed=1, root=tmp_path)
    cold = time.monotonic() - start
    folders = sorted(p.name for p in tmp_path.iterdir())
    start = time.monotonic()
    again = nano_tasks("train", 2000, seed=1, root=tmp_path)
    warm = time.monotonic() - start
    assert _ids(again) == _ids(tasks) and sorted(p.name for p in tmp_path.iterdir()) == folders
    assert len(folders) == 2000 and not any(name.startswith(".") for name in folders)
    assert cold < 20 and warm < 10, (cold, warm)
    print(f"\n2000 nano tasks: {cold:.2f}s written, {warm:.2f}s reused")


def test_registered_suite_and_string_options(root):
    tasks = load_suite("nano", split="heldout", count="12", seed="5", root=root)
    assert _ids(tasks) == _ids(nano_tasks("heldout", 12, seed=5, root=root))
    assert all(t.tier == "nano" for t in tasks)


def test_folder_reloads_with_the_standard_loader(root):
    v = all_variants()[0]
    folder = materialise(v, root)
    assert materialise(v, root) == folder
    task = load_task(folder)
    assert task.id == v.task_id and task.spec == render(v)["spec.md"]


def _one_per_template(root):
    by_template = {}
    for v in all_variants():
        by_template.setdefault(v.template.key, v)
    return [load_task(materialise(v, root)) for v in by_template.values()]


@pytest.mark.slow
def test_gold_passes_and_empty_scores_zero_for_every_template(root):
    """The ``gyre tasks check`` preflight over one task per template."""
    tasks = _one_per_template(root)
    assert len(tasks) == len(TEMPLATES)
    start = time.monotonic()
    results = check_tasks(tasks)
    took = time.monotonic() - start
    problems = {r.task.id: r.problems for r in results if not r.ok}
    assert not problems, problems
    for r in results:
        assert r.gold.score == 1.0 and r.gold.collected == 4
        assert r.empty.score == 0.0 and r.visible.counts.passed == r.visible.counts.collected == 1
    print(f"\nnano preflight ({len(tasks)} tasks, gold + visible + empty): {took:.1f}s")


def test_a_wrong_constant_earns_partial_credit(root, tmp_path):
    v = next(v for v in all_variants() if v.template.key == "add")
    task = load_task(materialise(v, root))
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    gold = (task.gold_dir / "solution.py").read_text()
    (wrong / "solution.py").write_text(gold.replace(f"+ {v.const}", f"+ {v.const + 1}"))
    task.gold_dir = wrong
    result = run_preflight(task)
    assert result.passed == 1 and result.score == 0.25


def test_fixed_names_family_is_disjoint_by_operation_arguments_and_constant():
    """``names="fixed"``: every function is ``solve``; held-out (template, argument
    names, constant) keys never occur in training, whatever the phrasing."""
    from gyre_env.tasks import nano

    train = nano.sample_variants("train", None, 0, names="fixed")
    heldout = nano.sample_variants("heldout", None, 0, names="fixed")
    assert {v.name for v in train + heldout} == {"solve"}
    assert len(train) > 700 and len(heldout) > 150
    assert not {v.key for v in train} & {v.key for v in heldout}
    assert not {nano.render(v)["spec.md"] for v in train} & {
        nano.render(v)["spec.md"] for v in heldout
    }
    tasks = nano.nano_tasks("heldout", 4, seed=1, names="fixed")
    assert all("solve(" in t.spec for t in tasks)
    with pytest.raises(ValueError, match="names must be one of"):
        nano.all_variants("random")


def test_only_restricts_templates_without_moving_the_split():
    from gyre_env.tasks import nano

    arith = nano.sample_variants("heldout", None, 0, names="fixed", only="arithmetic")
    assert {v.template.key for v in arith} == {"add", "sub", "mul", "floordiv", "mod"}
    every = nano.sample_variants("heldout", None, 0, names="fixed")
    assert {v.key for v in arith} <= {v.key for v in every}  # same split, fewer templates
    assert {v.template.key for v in nano.sample_variants("train", 5, 0, only="add,sorted")} == {
        "add",
        "sorted",
    }
    with pytest.raises(ValueError, match="unknown nano templates"):
        nano.select_templates("arithmetics")


def test_wide_argument_names_only_add_training_tasks():
    """``arg_names="wide"``: more argument names, every one going with every operation of
    its kind in training; the held-out and validation draws are the same tasks as
    without them, so a held-out (operation, argument name) pair is still never trained."""
    import builtins
    import keyword

    from gyre_env.tasks import nano

    for kind, wide in nano._WIDE_ARGS.items():
        assert not set(wide) & set(nano._ARGS[kind])
        for name in (n for args in wide for n in args.split(", ")):
            assert name.isidentifier() and not keyword.iskeyword(name)
            assert not hasattr(builtins, name) and name not in {t.key for t in TEMPLATES}
    only = "upper,reverse,sum,max,sorted,abs,is_even,sign"
    for split, count in (("heldout", None), ("validation", None), ("heldout", 7)):
        plain = sample_variants(split, count, 3, names="fixed", only=only)
        wide = sample_variants(split, count, 3, names="fixed", only=only, arg_names="wide")
        assert [v.task_id for v in plain] == [v.task_id for v in wide]
    train = sample_variants("train", None, 0, names="fixed", only=only, arg_names="wide")
    fit = sample_variants("fit", None, 0, names="fixed", only=only, arg_names="wide")
    heldout = sample_variants("heldout", None, 0, names="fixed", only=only)
    assert len(train) > 1000 and {v.task_id for v in fit} < {v.task_id for v in train}
    assert not {v.key for v in train} & {v.key for v in heldout}
    # a wide name trains with every operation of its kind: it does not tell which one
    ops_of = {}
    for v in train:
        ops_of.setdefault(v.args, set()).add(v.template.key)
    assert ops_of["txt"] == {"upper", "reverse"} and ops_of["lst"] == {"sum", "max", "sorted"}
    v = next(v for v in train if v.args == "scores" and v.template.key == "sorted")
    files = render(v)
    assert "solve(scores)" in files["spec.md"] and "sorted(scores)" in files["gold/solution.py"]
    with pytest.raises(ValueError, match="arg_names must be one of"):
        all_variants("fixed", "huge")
