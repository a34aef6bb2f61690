"""The sparse exchange under the DDP hook: packing, residual migration, and the
two-phase padded all-gather on real gloo process groups (2 and 4 processes)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import compressors
from compressors.ddp.exchange import pack, resolve_gather, sparse_allgather_sum, unpack_rank
from compressors.ddp.memory import BucketMemory
from processes import ranks

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
NAN_PATTERN_INDEX = 0x7FC00000  # read as a float32 value this bit pattern is NaN


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    indices=st.lists(st.integers(0, 2**31 - 1), min_size=0, max_size=40, unique=True),
    extra=st.integers(0, 5),
    data=st.data(),
)
def test_pack_unpack_round_trip_is_exact(dtype, indices, extra, data):
    """Indices survive the bit-cast exactly (also NaN-looking patterns); values are untouched."""
    values = torch.tensor(
        data.draw(st.lists(st.floats(-1e3, 1e3, width=16), min_size=len(indices), max_size=len(indices))),
        dtype=dtype,
    )
    idx = torch.tensor(indices, dtype=torch.int64)
    padded = max(1, len(indices) + extra)
    buffer = pack(values, idx, padded)
    assert buffer.dtype == dtype
    gathered = torch.cat([torch.zeros_like(buffer), buffer]).view(2, buffer.numel())
    for chunk in (buffer, gathered[1]):
        back_values, back_indices = unpack_rank(chunk, len(indices), padded)
        assert torch.equal(back_indices, idx)
        assert torch.equal(back_values, values)


def test_pack_keeps_nan_bit_patterns_of_indices():
    values = torch.tensor([1.0, -2.0], dtype=torch.float32)
    idx = torch.tensor([NAN_PATTERN_INDEX, NAN_PATTERN_INDEX + 1])
    buffer = pack(values, idx, 3)
    assert torch.isnan(buffer[:2]).all()
    assert torch.equal(unpack_rank(buffer, 2, 3)[1], idx)


def test_pack_rejects_mismatched_or_oversized_selections():
    with pytest.raises(ValueError, match="3 values but 2 indices"):
        pack(torch.ones(3), torch.arange(2), 4)
    with pytest.raises(ValueError, match="does not fit 2 padded slots"):
        pack(torch.ones(3), torch.arange(3), 2)


def test_resolve_gather_names_bad_methods():
    assert resolve_gather("auto") in ("single", "into_tensor")
    assert resolve_gather("into_tensor") == "into_tensor"
    with pytest.raises(ValueError, match="'scatter' is not one of"):
        resolve_gather("scatter")


def _topk_memory(error_feedback: bool = True) -> BucketMemory:
    return BucketMemory(
        make_compressor=lambda index: compressors.create("topk", density=0.5),
        make_memory=compressors.ErrorFeedback if error_feedback else None,
    )


def test_bucket_memory_migrates_residuals_across_a_rebuild():
    """A rebuild that regroups parameters carries every residual slice to its new bucket."""
    memory = _topk_memory()
    first = ((101, 3), (102, 2), (103, 4))
    slot = memory.slot(first, torch.zeros(9), 0)
    slot.compress(torch.arange(1.0, 10.0))  # k = round(4.5) = 4 largest sent, the rest kept
    residual = slot.tensors()["residual"]
    assert torch.equal(residual, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0, 0.0]))
    assert memory.slot(first, torch.zeros(9), 0) is slot

    second_a = ((103, 4), (104, 1))  # 104 is a parameter never seen before
    second_b = ((102, 2), (101, 3))
    a = memory.slot(second_a, torch.zeros(5), 0)
    b = memory.slot(second_b, torch.zeros(5), 1)
    assert torch.equal(a.tensors()["residual"], torch.zeros(5))
    assert torch.equal(b.tensors()["residual"], torch.tensor([4.0, 5.0, 1.0, 2.0, 3.0]))
    assert set(memory.slots) == {second_a, second_b}
    assert memory.migrations == 1
    assert not memory.orphans
    assert a.compressor is not slot.compressor
    sent = b.compress(torch.zeros(5))  # the migrated residual is what gets sent next
    assert torch.equal(b.compressor.decompress(sent) + b.tensors()["residual"], torch.tensor([4.0, 5.0, 1.0, 2.0, 3.0]))


def test_bucket_memory_migrates_dgc_momentum_and_velocity():
    memory = BucketMemory(lambda index: compressors.create("topk", density=0.25),
                          lambda c: compressors.DGCMemory(c, momentum=0.5))
    slot = memory.slot(((1, 2), (2, 2)), torch.zeros(4), 0)
    slot.compress(torch.tensor([1.0, 2.0, 3.0, 8.0]))
    moved = memory.slot(((2, 2), (1, 2)), torch.zeros(4), 0)
    assert sorted(moved.tensors()) == ["momentum", "velocity"]
    assert torch.equal(moved.tensors()["velocity"], torch.tensor([3.0, 0.0, 1.0, 2.0]))


def test_bucket_memory_rejects_a_layout_that_does_not_match_the_buffer():
    with pytest.raises(ValueError, match="hold 5 elements but the bucket buffer has 6"):
        _topk_memory().slot(((1, 2), (2, 3)), torch.zeros(6), 0)


def test_bucket_memory_without_memory_keeps_no_state_and_drops_old_layouts():
    memory = _topk_memory(error_feedback=False)
    assert memory.slot(((1, 4),), torch.zeros(4), 0).tensors() == {}
    memory.slot(((1, 2), (2, 2)), torch.zeros(4), 0)
    assert list(memory.slots) == [((1, 2), (2, 2))]


# --- real gloo process groups -------------------------------------------------------------

NUMEL = 1000


def _selection(rank: int, count: int, dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s deterministic selection of ``count`` distinct positions (any rank can rebuild it)."""
    gen = torch.Generator().manual_seed(1000 + rank)
    indices = torch.randperm(NUMEL, generator=gen)[:count]
    values = (torch.randn(count, generator=gen) * 10).to(dtype)
    return values.to(device), indices.to(device)


def _exchange_worker(rank: int, world: int, rdv: str, out_dir: str, counts: list[int], backend: str) -> None:
    torch.set_num_threads(1)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{rdv}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        results = {}
        for method in ("single", "into_tensor"):
            for dtype in (torch.float32, torch.float16):
                values, indices = _selection(rank, counts[rank], dtype, device)
                exchange = sparse_allgather_sum(values, indices, NUMEL, gather=method)
                got = exchange.future.wait()
                expected = torch.zeros(NUMEL, dtype=dtype, device=device)
                for r in range(world):
                    v, i = _selection(r, counts[r], dtype, device)
                    expected.index_add_(0, i, v)
                results[f"{method}-{dtype}"] = {
                    "equal": bool(torch.equal(got, expected)) and got.device == expected.device,
                    "counts": exchange.counts,
                    "padded": exchange.padded_count,
                    "bytes_sent": exchange.bytes_sent,
                    "payload_bytes": exchange.payload_bytes,
                    "got_sum": float(got.double().sum()),
                }
        try:
            values, indices = _selection(rank, 3, torch.float32, device)
            sparse_allgather_sum(values, indices, NUMEL, error="bad gradient" if rank == world - 1 else None)
            results["error"] = "none raised"
        except ValueError as exc:
            results["error"] = str(exc)
        try:
            sparse_allgather_sum(torch.zeros(0, device=device), torch.zeros(0, dtype=torch.long, device=device), NUMEL)
            results["empty"] = "none raised"
        except ValueError as exc:
            results["empty"] = str(exc)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _run_exchange(tmp_path: Path, counts: list[int], backend: str) -> list[dict]:
    world = len(counts)
    ranks.spawn(_exchange_worker, (world, str(tmp_path / "rdv"), str(tmp_path), counts, backend), world)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("counts", [[1, 37], [5, 1, 120, 9]], ids=["2-ranks", "4-ranks"])
def test_padded_allgather_sums_uneven_selections(tmp_path, counts):
    """Uneven counts (one rank selecting a single element) give the exact dense sum on every rank,
    with both all-gather entry points and with fp32 and fp16 values; a failure on one rank
    makes every rank raise instead of hanging; all-empty selections are refused everywhere."""
    _check_exchange(_run_exchange(tmp_path, counts, "gloo"), counts)


@pytest.mark.gpu
@pytest.mark.timeout(240)
def test_padded_allgather_on_nccl(tmp_path):
    """The same exchange on NCCL with CUDA tensors, one rank per visible GPU (at most 4)."""
    counts = [1, 37, 5, 120][: min(4, torch.cuda.device_count())]
    _check_exchange(_run_exchange(tmp_path, counts, "nccl"), counts)


def _check_exchange(results: list[dict], counts: list[int]) -> None:
    padded = max(counts)
    for rank, result in enumerate(results):
        for key in ("single-torch.float32", "into_tensor-torch.float32", "single-torch.float16", "into_tensor-torch.float16"):
            entry = result[key]
            assert entry["equal"], (rank, key)
            assert entry["counts"] == counts
            assert entry["padded"] == padded
        fp32, fp16 = result["single-torch.float32"], result["single-torch.float16"]
        assert fp32["bytes_sent"] == 8 + padded * (4 + 4)
        assert fp16["bytes_sent"] == 8 + padded * 4 + (padded + padded % 2) * 2
        assert fp32["payload_bytes"] == counts[rank] * 8
        assert fp16["payload_bytes"] == counts[rank] * 6
        assert f"rank(s) [{len(counts) - 1}] could not select" in result["error"]
        assert "every rank selected 0 elements" in result["empty"]
    assert results[-1]["error"].endswith("bad gradient")
    sums = {result["single-torch.float32"]["got_sum"] for result in results}
    assert len(sums) == 1
