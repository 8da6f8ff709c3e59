"""The engines that serve a run's rollouts (``rollout.engine``), checked before any work,
and the weight push after each optimizer step.

``embedded``: one transformers engine per cell in this process (the CPU default).
``sglang``: one SGLang server per cell (``[rollout.sglang]``), attached by URL or launched
here, each wrapped in a :class:`~gyre_env.weightsync.sglang.SyncedSGLangEngine` so that a
trainer's named tensors reach it over SGLang's update API in the configured mode. The
proxy still owns tokenization: the servers get token ids and return token ids and
logprobs, which the records keep as they came. An SGLang server cannot export a
request's KV: when its cell leaves ROLLOUT its running requests are aborted on the
server (``/pause_generation``, ``mode: abort``) and the router continues each from its
token ids on a cell that still serves (``SGLangEngine.abort_inflight``).

``preflight`` refuses, naming the cause, before a store, trainer or sandbox exists: an
URL nobody answers, a server whose model is not ``model.path``'s (vocabulary and hidden
size), ``sglang`` on a machine without CUDA and without ``urls``, ``launch = true``
without sglang installed, and a ``tensor`` weight sync where it cannot run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from pathlib import Path

from gyre_env.config import ConfigError
from gyre_env.train.config import TrainConfig

log = logging.getLogger(__name__)

PAUSE_MODE = "abort"
"""How a run's SGLang servers pause: running requests end with ``abort`` and the router
re-prefills them elsewhere from their token ids (SGLang exports no KV)."""


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


def preflight(cfg: TrainConfig, model_dir: Path, *, cells: int = 1) -> None:
    """The checks of ``rollout.engine = "sglang"`` that need I/O, before any work (a
    ``ConfigError`` naming the cause); nothing for the embedded engine."""
    if cfg.rollout.engine != "sglang":
        return
    s = cfg.rollout.sglang
    if not s.urls and not _cuda_available():
        raise ConfigError(
            "rollout.engine = 'sglang' with no rollout.sglang.urls launches SGLang servers "
            "here, and this machine has no CUDA device (torch.cuda.is_available() is "
            "False): give the urls of running servers, or use rollout.engine = 'embedded'"
        )
    if s.urls and cells > 1 and len(s.urls) != cells:
        raise ConfigError(
            f"rollout.sglang.urls: {len(s.urls)} servers for {cells} elastic cells; give "
            "one server per cell"
        )
    installed = importlib.util.find_spec("sglang") is not None
    if s.launch and not installed:
        raise ConfigError(
            "rollout.sglang.launch = true starts `python -m sglang.launch_server`, but "
            "sglang is not installed: pip install 'gyre-env[sglang]'"
        )
    if s.launch and _cuda_devices() < cells * s.tp_size:
        raise ConfigError(
            f"rollout.sglang.launch: {cells} server(s) of tp_size {s.tp_size} need "
            f"{cells * s.tp_size} GPUs; this machine has {_cuda_devices()}"
        )
    if s.weight_sync == "tensor" and not (installed and _cuda_available()):
        raise ConfigError(
            "rollout.sglang.weight_sync = 'tensor' passes CUDA IPC handles (sglang's "
            "serializer) to servers on this host, and "
            + ("this machine has no CUDA device" if installed else "sglang is not installed")
            + ": use weight_sync = 'disk' or 'distributed'"
        )
    for i, url in enumerate(s.urls):
        _check_server(f"rollout.sglang.urls[{i}]", url, model_dir, s.api_key)


def _check_server(key: str, url: str, model_dir: Path, api_key: str | None) -> None:
    """``url`` answers ``/get_model_info`` and serves ``model_dir``'s model."""
    from gyre_env.engines.base import EngineError
    from gyre_env.engines.sglang import SGLangEngine

    engine = SGLangEngine(url=url, api_key=api_key, request_timeout_s=15.0)
    try:
        info = asyncio.run(_model_info(engine))
    except EngineError as e:
        raise ConfigError(f"{key} = {url!r}: no SGLang server answers there ({e})") from None
    problem = model_mismatch(info, model_dir)
    if problem:
        raise ConfigError(f"{key} = {url!r} serves another model than model.path: {problem}")


async def _model_info(engine) -> dict:
    try:
        return await engine.model_info()
    finally:
        await engine.aclose()


def model_shape(config: dict) -> tuple[int | None, int | None]:
    """(vocab_size, hidden_size) of a Hugging Face ``config.json`` (a multimodal model's
    ``text_config`` when the top level lacks them)."""
    text = config.get("text_config") or {}
    vocab = config.get("vocab_size", text.get("vocab_size"))
    hidden = config.get("hidden_size", text.get("hidden_size"))
    return vocab, hidden


def model_mismatch(info: dict, model_dir: Path) -> str | None:
    """Why the server of ``/get_model_info`` ``info`` does not serve ``model_dir``'s
    model (vocabulary or hidden size differ), or None. The sizes are the response's own
    when it has them, else those of the ``config.json`` at its ``model_path`` when that
    folder is readable here; a server whose model cannot be read here is let through with
    a warning (its ids and logprobs are still checked by the trainer's shapes)."""
    want = model_shape(json.loads((Path(model_dir) / "config.json").read_text()))
    have = (info.get("vocab_size"), info.get("hidden_size"))
    path = info.get("model_path")
    if None in have and path and (Path(path) / "config.json").is_file():
        have = model_shape(json.loads((Path(path) / "config.json").read_text()))
    if None in have:
        log.warning(
            "the SGLang server's model (%s) cannot be read here: its vocabulary and hidden "
            "size are not compared with model.path's",
            path,
        )
        return None
    names = ("vocab_size", "hidden_size")
    diffs = [f"{n} {h} (model.path: {w})" for n, h, w in zip(names, have, want, strict=True)
             if h != w]  # fmt: skip
    return f"its model ({path}) has " + ", ".join(diffs) if diffs else None


def engine_names(cfg: TrainConfig) -> list[str]:
    """The synchronous loop's engines: the embedded one, or one per SGLang URL (the
    router spreads the calls over them), or one launched server."""
    if cfg.rollout.engine == "embedded":
        return ["embedded"]
    return [f"sglang{i}" for i in range(max(len(cfg.rollout.sglang.urls), 1))]


def rollout_engines(cfg: TrainConfig, model_dir: Path, names: list[str]) -> list:
    """The started engines that serve the rollouts, one per name (a cell each)."""
    if cfg.rollout.engine == "embedded":
        from gyre_env.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig

        return [
            EmbeddedEngine(
                EmbeddedEngineConfig(
                    model_path=str(model_dir),
                    name=name,
                    max_batch_size=max(cfg.rollout.parallel, 1),
                    context_length=cfg.model.context_length,
                )
            )
            for name in names
        ]
    engines = []
    try:
        for i, name in enumerate(names):
            engines.append(_sglang_engine(cfg, model_dir, i, name))
    except BaseException:
        for engine in engines:
            engine.close()
        raise
    return engines


def _sglang_engine(cfg: TrainConfig, model_dir: Path, i: int, name: str):
    """Cell ``i``'s server (attached or launched), started, under its own weight sync."""
    from gyre_env.engines.sglang import SGLangEngine, SGLangEngineConfig
    from gyre_env.weightsync.sglang import SGLangSyncConfig, SyncedSGLangEngine

    s = cfg.rollout.sglang
    common = dict(
        name=name, pause_mode=PAUSE_MODE, tp_size=s.tp_size, api_key=s.api_key,
        context_length=cfg.model.context_length, max_batch_size=max(cfg.rollout.parallel, 1),
    )  # fmt: skip
    if s.urls:
        config = SGLangEngineConfig(url=s.urls[i], **common)
    else:
        gpus = ",".join(str(g) for g in range(i * s.tp_size, (i + 1) * s.tp_size))
        config = SGLangEngineConfig(
            model_path=str(model_dir), port=s.port + i, launch_timeout_s=s.launch_timeout_s,
            env={"CUDA_VISIBLE_DEVICES": gpus}, launch_args=launch_args(cfg), **common,
        )  # fmt: skip
    engine = SGLangEngine(config)
    asyncio.run(engine.start())
    sync = SGLangSyncConfig(
        mode=s.weight_sync, timeout_s=s.sync_timeout_s, backend=s.sync_backend,
        master_address=s.master_address, master_port=s.master_port + i,
        export_dir=str(cfg.out_dir / "sglang-weights" / name), base_model_path=str(model_dir),
    )  # fmt: skip
    return SyncedSGLangEngine(engine, sync)


def launch_args(cfg: TrainConfig) -> list[str]:
    """The flags a launched server needs beyond ``--model-path/--host/--port``: its share
    of GPU memory, tensor parallelism, releasable memory (a cell leaving ROLLOUT frees it),
    a context of ``model.context_length``, then the user's ``launch_args``."""
    s = cfg.rollout.sglang
    return [
        "--mem-fraction-static", str(s.mem_fraction), "--tp-size", str(s.tp_size),
        "--enable-memory-saver", "--context-length", str(cfg.model.context_length),
        *(["--api-key", s.api_key] if s.api_key else []), *s.launch_args,
    ]  # fmt: skip


def attach_router(engines: list, router) -> None:
    """Failed weight updates of SGLang engines take them out of ``router``'s routing."""
    for engine in engines:
        if hasattr(engine, "attach_router"):
            engine.attach_router(router)


async def push_weights(engines: list, named: list, version: int) -> None:
    """``named`` (the trainer's HF-named tensors) into every engine as ``version``.

    Embedded engines swap them in-process. An SGLang server that fails is excluded from
    routing by name and resynced at once (a full update of the same version); one that
    fails that too stays out until a later push succeeds, and the push raises only when
    no engine serves ``version``."""
    from gyre_env.weightsync.base import WeightSyncError
    from gyre_env.weightsync.inprocess import InProcessPublisher

    embedded = [e for e in engines if not hasattr(e, "attach_router")]
    if embedded:
        await InProcessPublisher(embedded).apublish(named, version)
    failed = []
    for engine in [e for e in engines if hasattr(e, "attach_router")]:
        try:
            await engine.update_weights(named, version)
        except WeightSyncError as first:
            log.warning("%s: %s; resyncing", engine.name, first)
            try:
                await engine.update_weights(named, version)
            except WeightSyncError as e:
                failed.append(f"{engine.name}: {e}")
    if failed and len(failed) == len(engines):
        raise WeightSyncError(
            f"no engine loaded version {version}: " + "; ".join(failed), peer="every server"
        )
    for reason in failed:
        log.warning("WEIGHT_SYNC_FAILED %s (out of routing until a later push succeeds)", reason)
