"""The built-in tiny model: a seeded random-init causal LM and a locally trained tokenizer.

Gyre must run end to end on a CPU with no model hub, so the default model is made here on
first use and cached as an ordinary Hugging Face model folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, and the chat template
that transformers saves beside them, ``chat_template.jinja``).
Nothing is downloaded. The model is random, so its text is gibberish; what matters is that
every piece of the pipeline (chat rendering, tool-call tokens, multi-byte UTF-8 split
between byte-level tokens, 128k-token contexts, logprobs, weight updates) is exercised.

Creation is deterministic: the same ``TinyModelConfig`` gives identical token ids and
identical weights, on any machine with the same torch build. It takes a few seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from gyre_env._optional import require
from gyre_env.paths import cache_root

TINY_MODEL_NAME = "tiny-v1"
BUILD_RECIPE = 3
"""Bump when build_tokenizer/build_tiny_model change what they write (new cache folder)."""
MARKER_FILE = "gyre-tiny.json"
"""Written last inside the folder; a folder without it is incomplete and is rebuilt."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Control tokens: never produced by tokenizing ordinary text, dropped by skip_special_tokens."""

TOOL_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<tools>",
    "</tools>",
    "<think>",
    "</think>",
]
"""Added (non-special) tokens: one id each, and they decode back to their text."""

# The same text pipeline as Qwen2's tokenizer (NFC, this split regex, byte-level), so that
# transformers' AutoTokenizer (which rebuilds Qwen2 tokenizers from vocab and merges with
# this regex, whatever tokenizer.json says) and the raw tokenizer.json encode identically.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# The merges are learned with one change: a word never includes the space or bracket
# before it. Qwen2's regex lets one such character lead a word, so BPE learned merges like
# "(coun" and " key", and with this small vocabulary a name became different tokens in
# different places ("(key" in a signature, " key" in a body, "(coun"+"t" against
# " count"): a tiny model then had to learn that those are one name before it could copy a
# parameter name from a spec into code. With no merge across that boundary, Qwen2's regex
# then splits "(key" and " key" into "(" or " " and the same "key" tokens: on ASCII text,
# identical ids to tokenizing with TRAIN_REGEX, and a name is the same tokens wherever it
# stands.
TRAIN_REGEX = PRETOKENIZE_REGEX.replace(r"[^\r\n\p{L}\p{N}]?\p{L}+", r"\p{L}+")

# Qwen2.5/Hermes-style template with tools. Tool results are rendered inside a user turn,
# consecutive tool messages share one turn, each wrapped in <tool_response>.
CHAT_TEMPLATE = r"""
{%- macro text(content) -%}
{%- if content is none -%}
{%- elif content is string -%}{{- content -}}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = text(messages[0].content) -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set system_text = 'You are a helpful assistant.' if tools else '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' + system_text + '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system_text -%}
    {{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message.role == 'tool' -%}
        {%- if loop.first or loop_messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or loop_messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if message.reasoning_content -%}{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' -}}{%- endif -%}
        {%- set body = text(message.content) -%}
        {{- body -}}
        {%- for call in message.tool_calls or [] -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if body or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
            {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'user' or message.role == 'system' -%}
        {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
    {%- else -%}
        {{- raise_exception('unknown message role: ' + message.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


@dataclass(kw_only=True)
class TinyModelConfig:
    """Shape of the built-in model. Any change gives a new cache folder (see fingerprint)."""

    seed: int = 0
    """Seeds the weights (the tokenizer is trained deterministically from the corpus)."""
    vocab_size: int = 4096
    """Upper bound for BPE training; the small corpus may stop short of it."""
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    context_length: int = 131072
    """``max_position_embeddings``: 128k-token prompts are accepted."""
    rope_theta: float = 1_000_000.0
    initializer_range: float = 0.3
    """Larger than usual so that the random model's next-token distribution is peaked:
    greedy decoding then has clear winners, not near-ties decided by rounding."""
    words: tuple[str, ...] = ()
    """Whole words the tokenizer keeps as single tokens, each with an embedding of its own
    (see :func:`build_tokenizer`)."""

    def __post_init__(self) -> None:
        self.words = tuple(check_words(self.words))

    def fingerprint(self) -> str:
        """Hash of everything the model is built from: this config, corpus, template, recipe."""
        fields = asdict(self)
        if not self.words:  # the models built before words existed keep their folders
            del fields["words"]
        blob = json.dumps(fields, sort_keys=True) + _corpus_text() + CHAT_TEMPLATE
        blob += f"recipe-{BUILD_RECIPE}"
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_model_path(config: TinyModelConfig | None = None, root: str | Path | None = None) -> Path:
    """Return the folder of the built-in tiny model, creating it first if missing.

    Safe under concurrency (threads and processes): builders serialize on a lock file and
    the folder appears atomically by rename, complete with its marker file.
    """
    config = config or TinyModelConfig()
    base = Path(root) if root is not None else cache_root()
    name = f"{TINY_MODEL_NAME}-{config.fingerprint()}"  # a changed recipe gets a new folder
    target = base / "models" / name
    if (target / MARKER_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{name}.lock"):
        if (target / MARKER_FILE).is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            build_tiny_model(tmp, config)
            if target.exists():  # an incomplete folder left by a crash
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _corpus_text() -> str:
    return resources.files("gyre_env.engines").joinpath("tiny_corpus.txt").read_text("utf-8")


def check_words(words) -> list[str]:
    """``words`` as a list, each checked to be one word of ASCII letters and digits (a
    ValueError names the first that is not)."""
    if isinstance(words, str):
        raise ValueError(f"words must be a list of words, got the string {words!r}")
    out = list(words)
    for w in out:
        if not isinstance(w, str) or not re.fullmatch(r"[A-Za-z0-9]+", w):
            raise ValueError(f"words: {w!r} is not one word of ASCII letters and digits")
    return out


def build_tokenizer(vocab_size: int = 4096, words=()):
    """Train a byte-level BPE tokenizer on the built-in corpus; returns a ``tokenizers.Tokenizer``.

    Byte-level: every string is encodable, and characters missing from the learned merges
    (most emoji, rare CJK) are split into several single-byte tokens. ``words`` are added
    whole, as tokens of their own (matched wherever they occur in the text, so a word that
    is part of a longer one splits it): a model then gives each its own embedding, where
    BPE would spell an unseen word out of pieces other words share.
    """
    tk = require("tokenizers", "the built-in tiny tokenizer")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.normalizer = tk.normalizers.NFC()
    tokenizer.pre_tokenizer = _pre_tokenizer(tk, TRAIN_REGEX)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = _corpus_text().splitlines(keepends=True)
    tokenizer.train_from_iterator(lines, trainer=trainer)
    tokenizer.pre_tokenizer = _pre_tokenizer(tk, PRETOKENIZE_REGEX)  # what every reader uses
    tokenizer.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    words = [w for w in dict.fromkeys(check_words(words)) if tokenizer.token_to_id(w) is None]
    tokenizer.add_tokens([tk.AddedToken(w, special=False, normalized=False) for w in words])
    return tokenizer


def _pre_tokenizer(tk, regex: str):
    return tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(regex), behavior="isolated", invert=False),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_tiny_model(folder: str | Path, config: TinyModelConfig | None = None) -> Path:
    """Write the tiny model and its tokenizer into ``folder`` (no locking; see tiny_model_path)."""
    config = config or TinyModelConfig()
    torch = require("torch", "the built-in tiny model")
    transformers = require("transformers", "the built-in tiny model")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(config.vocab_size, config.words),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=config.context_length,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(folder)
    _finish_tokenizer_config(folder, "Qwen2Tokenizer")
    im_end = hf_tok.convert_tokens_to_ids("<|im_end|>")
    pad = hf_tok.convert_tokens_to_ids("<|endoftext|>")

    model_config = transformers.Qwen2Config(
        vocab_size=len(hf_tok),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.context_length,
        rope_theta=config.rope_theta,
        initializer_range=config.initializer_range,
        tie_word_embeddings=True,
        eos_token_id=im_end,
        pad_token_id=pad,
        bos_token_id=None,
        use_sliding_window=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = transformers.Qwen2ForCausalLM(model_config)
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = pad
    hf_logging = transformers.utils.logging
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Writing model shards" bar is noise here
    try:
        model.save_pretrained(folder)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    marker = {
        "name": TINY_MODEL_NAME,
        "config": asdict(config),
        "fingerprint": config.fingerprint(),
    }
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    return folder


def _finish_tokenizer_config(folder: Path, tokenizer_class: str) -> None:
    """Name the tokenizer class, and keep the chat template in tokenizer_config.json too
    (older transformers and other readers look there, not in chat_template.jinja)."""
    path = folder / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data["tokenizer_class"] = tokenizer_class
    data["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_tokenizer(path: str | Path | None = None):
    """Load the Hugging Face tokenizer of a model folder (default: the tiny model).

    Returns a ``PreTrainedTokenizerFast``: ``apply_chat_template(messages, tools=...,
    add_generation_prompt=True, tokenize=True)`` renders a prompt; ``.backend_tokenizer`` is
    the raw ``tokenizers.Tokenizer`` for fast incremental encoding.
    """
    transformers = require("transformers", "loading a tokenizer")
    folder = Path(path) if path is not None else tiny_model_path()
    if (
        not (folder / "tokenizer_config.json").is_file()
        and not (folder / "tokenizer.json").is_file()
    ):
        raise FileNotFoundError(f"no tokenizer files in {folder}")
    return transformers.AutoTokenizer.from_pretrained(str(folder))
