"""Published sharded-training throughput (profiles/sharded-throughput.json) against projections."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import traces.llm
from costs import devices, sharded_fit, throughput
from costs.sharded_fit import HELD_OUT
from traces.llm.config import parse

ROOT = Path(__file__).resolve().parent.parent


def test_the_table_has_fifteen_rows_of_three_harnesses_besides_the_held_out_each_citing_its_source():
    rows = sharded_fit.load()
    banded = [r for r in rows if not r.held_out]
    assert len(banded) >= 15 and len({r.harness for r in banded}) >= 3
    assert len({r.gpus for r in banded}) >= 4
    assert {r.harness for r in rows if r.held_out} == set(HELD_OUT)
    raw = json.loads(sharded_fit.table_path().read_text())["rows"]
    for row, given_row in zip(rows, raw):
        assert row.device in devices.names() and (ROOT / "profiles" / "devices" / f"{row.device}.json").is_file()
        assert row.source.startswith("https://github.com/") and "/blob/" in row.source and row.where and row.run_by
        assert len(row.source.split("/blob/")[1].split("/")[0]) == 40, row.source  # pinned to a commit
        assert row.tokens_per_s_per_gpu > 0 and row.global_batch_sequences * row.tokens == given_row["global_batch_tokens"]


def test_every_stated_model_has_its_published_parameter_count():
    """A row's shapes for the testbed (a shipped model, or the config it states) hold exactly the
    parameters its source publishes (where it publishes an exact count): MPT in GPT-2's naming
    equals llm-foundry's NumParams."""
    checked = 0
    for row in sharded_fit.load():
        if row.config is None or row.parameters is None:
            continue
        if isinstance(row.config, str):
            count = traces.llm.parameter_count(traces.llm.load(row.config))
        else:
            count = traces.llm.parameter_count(parse(dict(row.config), row.model))
        assert count == row.parameters, row.model
        checked += 1
    assert checked >= 30


def _write(tmp_path, change):
    data = json.loads(sharded_fit.table_path().read_text())
    change(data["rows"][3])
    path = tmp_path / "table.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("change, words", [
    (lambda r: r.update(source=""), "source must be given"),
    (lambda r: r.update(device="tpu-v5"), "not in profiles/devices"),
    (lambda r: r.update(held_out=True), "held_out must be true exactly"),
    (lambda r: r.update(parallel="zero9"), "parallel 'zero9'"),
    (lambda r: r.update(tokens_per_s_per_gpu=0), "tokens_per_s_per_gpu"),
    (lambda r: r.update(gpus=100, tensor_parallel=8), "multiple of tensor"),
    (lambda r: r.update(global_batch_tokens=1), "global_batch_tokens"),
])
def test_a_malformed_row_is_refused_naming_it(tmp_path, change, words):
    with pytest.raises(ValueError, match=r"row 3: .*" + words):
        sharded_fit.load(_write(tmp_path, change))


FACTOR = {"llm-foundry": 1.3, "accelerate": 0.7, "lit-gpt": 0.9, "nemo": 1.0, "megatron-bridge": 1.1}


def _synthetic(row):
    """A projection off by a factor per harness and a little per row, every row projected."""
    if row.held_out:
        return row.tokens_per_s_per_gpu * 50.0
    return row.tokens_per_s_per_gpu * FACTOR[row.harness] * (1 + 0.01 * (row.gpus % 7))


def test_the_band_is_sized_leave_one_harness_out_over_the_banded_rows_only():
    checked = sharded_fit.check(_synthetic)
    sized = sharded_fit.band(checked)
    banded = [c for c in checked if not c.row.held_out]
    ratios = [c.ratio for c in banded]
    # by hand: the largest trim whose band, sized without a row's harness, holds ≥ 90 % of the rows
    best = 0.0
    for i in range(int(0.5 / throughput.TRIM_STEP)):
        trim = i * throughput.TRIM_STEP
        inside = 0
        for harness in FACTOR:
            others = sorted(c.ratio for c in banded if c.row.harness != harness)
            k = math.floor(trim * len(others) + 1e-9)
            low, high = min(1.0, others[k]), max(1.0, others[-1 - k])
            inside += sum(low <= c.ratio <= high for c in banded if c.row.harness == harness)
        if inside / len(banded) >= throughput.COVERAGE:
            best = trim
    k = math.floor(best * len(ratios) + 1e-9)
    assert sized["trim"] == best and sized["rows"] == len(banded) and sized["harnesses"] == len(FACTOR)
    assert (sized["low"], sized["high"]) == (min(1.0, sorted(ratios)[k]), max(1.0, sorted(ratios)[-1 - k]))


def test_the_held_out_harnesses_leave_the_band_unchanged_and_are_checked_against_it():
    checked = sharded_fit.check(_synthetic)
    other = sharded_fit.check(lambda r: r.tokens_per_s_per_gpu * 0.01 if r.held_out else _synthetic(r))
    assert sharded_fit.band(checked) == sharded_fit.band(other)
    held = sharded_fit.independent(checked, sharded_fit.band(checked))
    assert {c.row.harness for c, _ in held} == set(HELD_OUT)
    assert all(c.ratio == pytest.approx(50.0) and inside is False for c, inside in held)


def test_rows_a_projection_cannot_take_say_why_and_one_harness_gives_no_band():
    checked = sharded_fit.check(lambda r: r.tokens_per_s_per_gpu if r.harness == "llm-foundry" else "not modelled")
    assert all(c.why == "not modelled" and c.ratio is None for c in checked if c.row.harness != "llm-foundry")
    assert sharded_fit.band(checked) is None
    assert "No band" in sharded_fit.report(checked)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 20), st.sampled_from("abcd")), min_size=4, max_size=40))
def test_the_band_of_any_ratios_holds_one_and_its_stated_coverage(pairs):
    ratios, harnesses = [x for x, _ in pairs], [h for _, h in pairs]
    sized = throughput.harness_band(ratios, harnesses)
    assert sized["low"] <= 1 <= sized["high"]
    assert sized["inside"] == sum(sized["low"] <= x <= sized["high"] for x in ratios) / len(ratios)
    assert sized["trim"] == 0 or sized["out_of_harness"] >= throughput.COVERAGE
    assert sized["inside"] >= 1 - 2 * sized["k"] / len(ratios)


def test_the_projection_takes_every_bf16_data_parallel_row_with_shapes_and_says_why_not_for_the_rest():
    from pipeline import published_sharded

    checked = sharded_fit.check(published_sharded.projection)
    for c in checked:
        r = c.row
        takes = r.config is not None and r.precision == "amp" and r.data_parallel == r.gpus
        assert (c.ratio is not None) == takes, (r.model, r.harness, c.why)
    assert {"fp8: not a modelled precision", "no stated shapes"} <= {c.why for c in checked if c.ratio is None} <= {
        "fp8: not a modelled precision", "no stated shapes", "tensor/pipeline/context parallel: not modelled"}
    assert all(0.3 < c.ratio < 3 for c in checked if c.ratio is not None)
    assert {c.row.harness for c in checked if c.ratio is not None} >= {"llm-foundry", "accelerate", *HELD_OUT}


def test_a_row_is_projected_under_its_own_parallel_plan():
    """A SHARD_GRAD_OP row is ZeRO-2 with its micro-batch; full checkpointing recomputes, selective does not."""
    from pipeline import published_sharded

    rows = sharded_fit.load()
    zero2 = next(r for r in rows if r.parallel == "zero2")
    plan = published_sharded.sharding(zero2)
    assert (plan.parallel, plan.micro_batch, plan.checkpointing) == ("zero2", zero2.micro_batch, False)
    full = next(r for r in rows if r.activation_checkpointing is True)
    selective = next(r for r in rows if r.activation_checkpointing == "selective")
    assert published_sharded.sharding(full).checkpointing and not published_sharded.sharding(selective).checkpointing


def test_the_devices_doc_prints_the_table_as_computed():
    """docs/devices.md holds ``python -m pipeline.published_sharded``'s table between its markers."""
    from pipeline import published_sharded

    text = (ROOT / "docs" / "devices.md").read_text()
    start, end = "<!-- sharded-table: python -m pipeline.published_sharded -->", "<!-- /sharded-table -->"
    assert text.split(start)[1].split(end)[0].strip() == published_sharded.report().strip()


def test_the_fit_module_imports_no_torch_and_no_simulator():
    code = "import sys, costs.sharded_fit; sharded = costs.sharded_fit.load(); print('torch' in sys.modules, 'simulator' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["False", "False"]
