"""gyre_env.trainers.hf_tree: the served Hugging Face model trains on packed trees.

Temperature and entropies, the chunked LM head, and that serving the same model object
(ordinary causal forward, KV-cache generation) is unchanged by a training call.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gyre_env.trainers.hf_tree import (
    TREE_ATTENTION,
    attention_for,
    tiny_qwen2,
    tree_attention_mode,
    tree_logprobs,
)

from gyre_env.trajectory.packing import pack
from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
from gyre_env.trajectory.synthetic import nl2repo_group
from gyre_env.trajectory.tree import build_trees

TOL = 1e-5


@pytest.fixture(scope="module")
def unit():
    records, episodes = nl2repo_group(
        spec_len=60, group_size=2, main_tokens=30, sub_tokens=20, turns=2
    )
    (u,), _ = bounded_samples(build_trees(records, episodes), SampleConfig(token_budget=10**6))
    return u


def _reference(model, flat, temperature: float):
    """(logprob, entropy) per loss token key, each path alone through model(input_ids)."""
    starts = np.flatnonzero(flat.parent_index < 0).tolist() + [len(flat)]
    out = {}
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        ids = torch.as_tensor(flat.input_ids[a:b])
        logp = torch.log_softmax(model(input_ids=ids[None]).logits[0].float() / temperature, -1)
        ent = -(logp.exp() * logp).sum(-1)
        for i in range(a + 1, b):
            if flat.loss_mask[i]:
                key = (flat.tree_index[i], flat.node_ids[i], flat.position_ids[i])
                out[key] = (logp[i - a - 1, flat.input_ids[i]], ent[i - a - 1])
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_temperature_and_entropy_match_each_path_alone(unit, temperature):
    model = tiny_qwen2().eval()
    tree, flat = pack(unit), pack(unit, flat=True)
    idx = np.flatnonzero(tree.loss_mask)
    with torch.no_grad():
        ref = _reference(model, flat, temperature)
        want = [ref[(tree.tree_index[i], tree.node_ids[i], tree.position_ids[i])] for i in idx]
        for attn in (attention_for(tree), attention_for(tree, dense_max_tokens=0, block_size=16)):
            lp, ent = tree_logprobs(
                model, tree.tensors(), attn, temperature=temperature, with_entropy=True
            )
            assert (lp - torch.stack([w[0] for w in want])).abs().max().item() <= TOL
            assert (ent - torch.stack([w[1] for w in want])).abs().max().item() <= TOL
    assert tree_logprobs(model, tree.tensors(), attn)[1] is None


def test_chunked_lm_head_gives_the_same_logprobs_entropies_and_gradients(unit):
    model = tiny_qwen2()
    p = pack(unit)
    batch, attn = p.tensors(), attention_for(p, dense_max_tokens=0, block_size=32)
    results = []
    for chunk in (7, 10**6):
        model.zero_grad()
        lp, ent = tree_logprobs(model, batch, attn, chunk_size=chunk, with_entropy=True)
        ((lp + 0.1 * ent) * torch.linspace(-1, 1, len(lp))).sum().backward()
        results.append((lp.detach(), ent.detach(), [q.grad.clone() for q in model.parameters()]))
    (a, ea, ga), (b, eb, gb) = results
    assert (a - b).abs().max().item() <= TOL and (ea - eb).abs().max().item() <= TOL
    assert max((x - y).abs().max().item() for x, y in zip(ga, gb, strict=True)) <= TOL


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_serving_is_unchanged_by_a_training_call(unit, impl):
    model = tiny_qwen2().eval()
    model.set_attn_implementation(impl)
    ids = torch.as_tensor(pack(unit).input_ids[:40])[None]
    with torch.no_grad():
        before = model(input_ids=ids).logits
        gen_before = model.generate(ids, max_new_tokens=4, do_sample=False)
        p = pack(unit)
        tree_logprobs(model, p.tensors(), attention_for(p))
        assert model.config._attn_implementation == impl
        with pytest.raises(TypeError):  # a failed training call restores it too
            tree_logprobs(model, p.tensors(), "not a structure")
        assert model.config._attn_implementation == impl
        assert torch.equal(model(input_ids=ids).logits, before)
        assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False), gen_before)


def test_ordinary_calls_inside_tree_mode_still_run_causally(unit):
    """Only the tree structure selects tree attention: an ordinary forward or a
    KV-cache generation while the switch is on gets SDPA with its causal mask."""
    model = tiny_qwen2().eval()
    ids = torch.as_tensor(pack(unit).input_ids[:40])[None]
    with torch.no_grad():
        want = model(input_ids=ids).logits
        gen = model.generate(ids, max_new_tokens=4, do_sample=False)
        with tree_attention_mode(model):
            assert model.config._attn_implementation == TREE_ATTENTION
            assert (model(input_ids=ids).logits - want).abs().max().item() <= TOL
            assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False), gen)


@pytest.mark.slow
def test_the_built_in_tiny_model_trains_exactly(unit, tmp_path):
    """The model the EmbeddedEngine serves (tied embeddings, loaded from its folder)."""
    from transformers import AutoModelForCausalLM

    from gyre_env.engines.tiny import tiny_model_path

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path(root=tmp_path)))
    model = model.float().eval()
    vocab = model.config.vocab_size
    tree, flat = pack(unit), pack(unit, flat=True)
    tree.input_ids, flat.input_ids = tree.input_ids % vocab, flat.input_ids % vocab
    ref = _reference(model, flat, 1.0)
    idx = np.flatnonzero(tree.loss_mask)
    want = torch.stack(
        [ref[(tree.tree_index[i], tree.node_ids[i], tree.position_ids[i])][0] for i in idx]
    ).detach()
    lp, _ = tree_logprobs(model, tree.tensors(), attention_for(tree, dense_max_tokens=0))
    assert (lp.detach() - want).abs().max().item() <= TOL
    lp.sum().backward()
    assert model.get_input_embeddings().weight.grad.abs().sum() > 0
