"""Requests too big for the machine are refused in one line before anything is allocated or
written: a capture's batch (its memory per sample measured on a probe step), a profile's sizes."""

from __future__ import annotations

import time

import pytest
import torch

from sidco.cli import main
from traces import workloads
from traces.capture import PROBE_SAMPLES, bytes_per_sample


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_bytes_per_sample_counts_the_input_and_the_saved_activations(one_thread):
    work = workloads.build("resnet20", batch_size=8, seed=0, device="cpu")
    before = [p.detach().clone() for p in work.model.parameters()]
    per_sample = bytes_per_sample(work)
    # at least the input image and the first conv's output (16 channels x 32 x 32, fp32), saved by its BN
    assert per_sample >= 3 * 32 * 32 * 4 + 16 * 32 * 32 * 4
    # and less than every activation of a 20-layer net counted 4 times (parameters are not counted)
    assert per_sample < 4 * 20 * 64 * 32 * 32 * 4
    assert all(torch.equal(a, b) for a, b in zip(before, work.model.parameters()))  # the model is untouched
    assert PROBE_SAMPLES >= 2  # batch norm needs two samples in train mode


def test_capture_refuses_a_batch_that_cannot_fit_before_writing(tmp_path, capsys, one_thread):
    out = tmp_path / "trace"
    code, err = _run(["capture", "--workload", "resnet20", "--batch-size", "100000000", "--iterations", "1",
                      "--every", "1", "--workers", "1", "--out", str(out), "--store", str(tmp_path / "r.sqlite")],
                     capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "lower --batch-size" in lines[0] and "per sample, measured" in lines[0]
    assert not out.exists() and not list(tmp_path.glob(".trace*"))


@pytest.mark.parametrize("size", ["100000000000", "2^40"])
def test_profile_refuses_sizes_that_cannot_fit_before_measuring(tmp_path, capsys, size):
    start = time.monotonic()
    code, err = _run(["profile", "--sizes", f"4096,{size}", "--compressors", "topk",
                      "--store", str(tmp_path / "r.sqlite")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "lower --sizes" in lines[0], err
    assert "GiB free" in lines[0]
    assert time.monotonic() - start < 10  # refused before the host is measured (tens of seconds)
