"""The built-in tiny model: deterministic creation, tokenizer properties, chat template."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest

from gyre_env.engines.tiny import (
    MARKER_FILE,
    TinyModelConfig,
    build_tiny_model,
    load_tokenizer,
    tiny_model_path,
)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_creation_is_deterministic_and_seed_matters(tmp_path, tiny_path):
    again = build_tiny_model(tmp_path / "again")
    for name in ["tokenizer.json", "model.safetensors", "config.json"]:
        assert _digest(again / name) == _digest(tiny_path / name), name
    other = build_tiny_model(tmp_path / "other", TinyModelConfig(seed=1))
    assert _digest(other / "tokenizer.json") == _digest(tiny_path / "tokenizer.json")
    assert _digest(other / "model.safetensors") != _digest(tiny_path / "model.safetensors")


def test_model_shape_accepts_long_contexts(tiny_path):
    config = json.loads((tiny_path / "config.json").read_text())
    assert config["max_position_embeddings"] >= 131072
    assert config["hidden_size"] == 64 and config["num_hidden_layers"] == 2


def test_concurrent_first_use_builds_once(tmp_path):
    results, errors = [], []

    def worker():
        try:
            results.append(tiny_model_path(root=tmp_path))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    folder = results[0]
    assert (folder / MARKER_FILE).is_file()
    leftovers = [p.name for p in folder.parent.iterdir() if p.is_dir() and p != folder]
    assert leftovers == []


def test_incomplete_folder_is_rebuilt(tmp_path):
    folder = tmp_path / "models" / f"tiny-v1-{TinyModelConfig().fingerprint()}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{truncated")
    assert tiny_model_path(root=tmp_path) == folder
    assert (folder / MARKER_FILE).is_file()
    json.loads((folder / "config.json").read_text())


def test_a_name_is_the_same_tokens_wherever_it_stands(tokenizer):
    """A parameter name copied from a spec into code must be the same ids in the signature,
    the body and the prose (Qwen2's regex alone glued "(" or " " to it: "(key" / " key")."""
    text = "Write solve(count) that returns count doubled.\ndef solve(count):\n    return count*2"
    pieces = [tokenizer.decode([i]) for i in tokenizer(text)["input_ids"]]
    assert pieces.count("count") == 4
    assert not any(p != "count" and "count" in p for p in pieces)
    for name in ["key", "items", "x", "value"]:
        alone = tokenizer(name)["input_ids"]
        for context in [f"({name})", f" {name}", f"={name}.", f"[{name}]"]:
            ids = tokenizer(context)["input_ids"]
            assert any(ids[i : i + len(alone)] == alone for i in range(len(ids))), (name, context)


def test_tokenizer_round_trips_and_splits_multibyte_characters(tokenizer, tiny_path):
    import tokenizers

    raw = tokenizers.Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    text = "def f(x):\n    return x  # ünïcödé 世界 🦀🐍 ok\n\t<tool_call>{}</tool_call>"
    ids = tokenizer(text)["input_ids"]
    assert raw.encode(text).ids == ids  # AutoTokenizer and tokenizer.json agree
    assert tokenizer.decode(ids) == text
    crab = tokenizer("🦀")["input_ids"]
    assert len(crab) > 1  # a 4-byte character split over byte-level tokens
    assert all("\ufffd" in tokenizer.decode([i]) for i in crab)
    assert 2000 <= len(tokenizer) <= 4096


def test_special_and_tool_tokens_are_single_ids(tokenizer):
    for token in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]:
        ids = tokenizer(token)["input_ids"]
        assert len(ids) == 1, token
        assert tokenizer.convert_ids_to_tokens(ids[0]) == token
    assert tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # tool-call markers decode as text even with skip_special_tokens; control tokens do not
    ids = tokenizer("<tool_call>x</tool_call><|im_end|>")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chat_template_renders_tools_calls_and_results(tokenizer):
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}
            ],
        },
        {"role": "tool", "content": "a.py"},
        {"role": "tool", "content": "b.py"},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '\n{"type": "function", "function": {"name": "run"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n'
        "</tool_call><|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n"
        "</tool_response><|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_template_without_tools_and_bad_role(tokenizer):
    text = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ],
        tokenize=False,
    )
    assert (
        text
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    )
    with pytest.raises(Exception, match="unknown message role"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_load_tokenizer_rejects_a_folder_without_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)


def test_words_are_single_tokens_with_embeddings_of_their_own(tmp_path, tiny_path):
    """``words``: an unseen word is one id (BPE spells it out of pieces other words share),
    the same in prose and code, each with its own embedding row; the default model's folder
    (its fingerprint) does not change with the option."""
    import transformers

    assert TinyModelConfig(words=()).fingerprint() == TinyModelConfig().fingerprint()
    assert TinyModelConfig(words=["ranog"]).fingerprint() != TinyModelConfig().fingerprint()
    plain = load_tokenizer(tiny_path)
    assert len(plain("ranog")["input_ids"]) > 1  # spelled out of pieces without the option
    folder = build_tiny_model(tmp_path / "words", TinyModelConfig(words=["ranog", "kipiv"]))
    tok = load_tokenizer(folder)
    ids = tok("the ranog of the string s, and kipiv(x) ranog")["input_ids"]
    ranog, kipiv = tok.convert_tokens_to_ids(["ranog", "kipiv"])
    assert ids.count(ranog) == 2 and ids.count(kipiv) == 1
    assert tok.decode(ids) == "the ranog of the string s, and kipiv(x) ranog"
    assert len(tok) == len(plain) + 2
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    emb = model.get_input_embeddings().weight
    assert emb.shape[0] == len(tok) and not emb[ranog].equal(emb[kipiv])


@pytest.mark.parametrize("words", ["ranog", ["two words"], [""], ["ok", 7]])
def test_bad_words_are_refused_by_name(words):
    with pytest.raises(ValueError, match="words"):
        TinyModelConfig(words=words)
