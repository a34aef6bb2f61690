"""DDP bucketing: compressors.ddp.buckets against torch's own bucket assignment and against the
buckets a real DistributedDataParallel (1-rank gloo) hands to its communication hook."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.parallel import DistributedDataParallel

from compressors.ddp.buckets import (
    DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    assign,
    bucket_caps,
)


def test_defaults_are_ddps():
    assert DEFAULT_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
    assert DEFAULT_BUCKET_CAP_BYTES == 25 * 2**20
    assert bucket_caps() == (2**20, 25 * 2**20)
    assert bucket_caps(0.5) == (2**19, 2**19)
    for bad in (0, -1.0, 1e-9):
        with pytest.raises(ValueError, match="bucket cap"):
            bucket_caps(bad)
    with pytest.raises(ValueError, match="bucket caps"):
        assign([4, 4], cap_bytes=0)


@settings(max_examples=150, deadline=None)
@given(
    numels=st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=30),
    first=st.integers(min_value=1, max_value=8000),
    cap=st.integers(min_value=1, max_value=20000),
)
def test_matches_torchs_bucket_assignment(numels, first, cap):
    """Torch's rebuild step: ``_compute_bucket_assignment_by_size`` over the parameters in
    gradient-ready (reverse) order with limits ``[first, cap]``."""
    tensors = [torch.empty(n) for n in numels]
    order = list(range(len(numels)))[::-1]
    expected, limits = dist._compute_bucket_assignment_by_size(
        [tensors[i] for i in order], [first, cap], [False] * len(order), order
    )
    assert assign([4 * n for n in numels], cap_bytes=cap, first_bytes=first) == [list(b) for b in expected]
    assert limits[0] == first and all(limit == cap for limit in limits[1:])


def test_exact_cap_closes_the_bucket():
    assert assign([4, 4, 4, 4], cap_bytes=8, first_bytes=4) == [[3], [2, 1], [0]]
    assert assign([100], cap_bytes=8, first_bytes=4) == [[0]]
    assert assign([]) == []


@pytest.fixture()
def gloo_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(40, 600), torch.nn.ReLU(), torch.nn.Linear(600, 500), torch.nn.ReLU(),
        torch.nn.Linear(500, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10),
    )


@pytest.mark.parametrize(
    "bucket_cap_mb,buckets",
    [
        # gradient bytes per parameter: 96000, 2400, 1200000, 2000, 600000, 1200, 12000, 40
        (None, [[7, 6, 5, 4, 3, 2], [1, 0]]),  # first bucket closes past 1 MiB, the rest stay under 25 MiB
        (0.5, [[7, 6, 5, 4], [3, 2], [1, 0]]),
        (1.0, [[7, 6, 5, 4, 3, 2], [1, 0]]),
        (0.01, [[7, 6], [5, 4], [3, 2], [1, 0]]),
    ],
)
def test_matches_real_ddp_buckets(gloo_group, bucket_cap_mb, buckets):
    """From its second iteration (after the rebuild) DDP reduces exactly these buckets."""
    module = _model()
    if bucket_cap_mb is None:
        model = DistributedDataParallel(module)
    else:
        model = DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)
    ids = {id(p): i for i, p in enumerate(module.parameters())}
    seen: dict[int, list[list[int]]] = {}
    step = [0]

    def hook(_state, bucket):  # no annotations: register_comm_hook checks them as objects
        seen.setdefault(step[0], []).append([ids[id(p)] for p in bucket.parameters()])
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    model.register_comm_hook(None, hook)
    for step[0] in range(3):
        model(torch.randn(8, 40)).sum().backward()
    first, cap = bucket_caps(bucket_cap_mb)
    nbytes = [p.numel() * p.element_size() for p in module.parameters()]
    assert assign(nbytes, cap_bytes=cap, first_bytes=first) == buckets
    assert seen[1] == buckets and seen[2] == buckets
