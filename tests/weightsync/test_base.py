"""The weight-sync contract: buckets keep bytes and dtypes, versions only go up, deadlines hold."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from gyre_env.weightsync.base import (
    Manifest,
    SyncConfig,
    SyncTimeoutError,
    VersionOrderError,
    alloc_buckets,
    call_with_deadline,
    check_version,
    named_list,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)


def tensors() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "a.fp32": torch.randn(33, 17, generator=g),
        "b.bf16": torch.randn(1001, generator=g).bfloat16(),
        "c.fp16": torch.randn(5, 7, generator=g).half(),
        "d.int64": torch.randint(-(1 << 40), 1 << 40, (13,), generator=g),
        "e.bool": torch.rand(9, generator=g) > 0.5,
        "f.scalar": torch.tensor(3.5),
        "g.big": torch.randn(4000, generator=g),  # 16 kB: larger than a bucket below
        "h.strided": torch.randn(8, 6, generator=g).t(),  # not contiguous
    }


def test_buckets_round_trip_bytes_and_dtypes_exactly():
    named = named_list(tensors())
    manifest = plan_buckets(named, bucket_bytes=4096, version=3)
    assert len(manifest.buckets) > 2
    assert all(b.nbytes <= 4096 or len(b.tensors) == 1 for b in manifest.buckets)
    assert manifest.names == [n for n, _ in named]  # order kept
    manifest = Manifest.from_json(manifest.to_json())  # what networked transports send
    buffers = alloc_buckets(manifest)
    source = dict(named)
    out = {}
    for bucket, buf in zip(manifest.buckets, buffers, strict=True):
        pack_bucket(bucket, source, buf)
        out.update(unpack_bucket(bucket, buf.clone()))
    for name, t in source.items():
        assert out[name].dtype == t.dtype, name
        assert out[name].shape == t.shape, name
        assert torch.equal(out[name], t), name
        assert (
            out[name].reshape(-1).view(torch.uint8).tolist()
            == t.contiguous().reshape(-1).view(torch.uint8).tolist()
        )


def test_offsets_are_aligned_for_any_dtype():
    manifest = plan_buckets(named_list(tensors()), bucket_bytes=1 << 20, version=1)
    assert all(t.offset % 64 == 0 for b in manifest.buckets for t in b.tensors)


def test_versions_strictly_increase():
    assert check_version(1, None, peer="p") == 1
    assert check_version(5, 4, peer="p") == 5
    with pytest.raises(VersionOrderError, match="engine-7.*not newer than 4"):
        check_version(4, 4, peer="engine-7")
    with pytest.raises(VersionOrderError):
        check_version(3, 4, peer="p")
    with pytest.raises(TypeError):
        check_version("5", 4, peer="p")
    with pytest.raises(TypeError):
        check_version(True, None, peer="p")


@pytest.mark.parametrize(
    "bad, error",
    [
        ({}, ValueError),
        ([("a", torch.zeros(1)), ("a", torch.zeros(1))], ValueError),
        ([("", torch.zeros(1))], TypeError),
        ([("a", [1.0])], TypeError),
        ([("a", torch.zeros(1, device="meta"))], ValueError),
        ([("a", torch.zeros(2).to_sparse())], ValueError),
        ([("a",)], TypeError),
    ],
)
def test_bad_tensors_are_rejected(bad, error):
    with pytest.raises(error):
        named_list(bad)


def test_config_is_checked():
    with pytest.raises(ValueError, match="bucket_bytes"):
        SyncConfig(bucket_bytes=10)
    with pytest.raises(ValueError, match="timeout_s"):
        SyncConfig(timeout_s=0)
    with pytest.raises(TypeError):
        SyncConfig(bucket_size=1 << 20)  # a typo is an error, not a silent default


def test_a_stuck_transfer_raises_within_its_deadline_naming_the_peer():
    start = time.monotonic()
    with pytest.raises(SyncTimeoutError, match="10.0.0.9:1234.*batched read.*0.3s"):
        call_with_deadline(
            lambda: time.sleep(5), timeout_s=0.3, peer="10.0.0.9:1234", what="batched read"
        )
    assert time.monotonic() - start < 1.5
    assert call_with_deadline(lambda: 7, timeout_s=1, peer="p", what="x") == 7


def test_import_is_light():
    code = (
        "import sys, gyre_env.weightsync as w; w.SyncConfig(); "
        "assert 'torch' not in sys.modules and 'mooncake' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_broadcast_segments_send_big_tensors_directly_and_cover_every_byte():
    from gyre_env.weightsync.distributed import segments

    named = named_list(tensors())
    manifest = plan_buckets(named, bucket_bytes=8192, version=1)
    plan = segments(manifest, direct_bytes=1000)
    sizes = {n: t.numel() * t.element_size() for n, t in named}
    assert {s.name for s in plan if s.name} == {n for n, b in sizes.items() if b >= 1000}
    for spec in (t for b in manifest.buckets for t in b.tensors if t.nbytes):
        i = next(i for i, b in enumerate(manifest.buckets) if spec in b.tensors)
        holders = [s for s in plan if s.bucket == i and s.start <= spec.offset < s.end]
        assert len(holders) == 1 and spec.offset + spec.nbytes <= holders[0].end, spec.name
        assert holders[0].name in (None, spec.name)
    # a packed run never swallows a direct tensor, and segments never overlap
    for i in range(len(manifest.buckets)):
        spans = sorted((s.start, s.end) for s in plan if s.bucket == i)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert all(s.name is None for s in segments(manifest, direct_bytes=1 << 30))
