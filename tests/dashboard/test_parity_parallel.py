"""The What-if page under --model and --parallel gives `sidco simulate --json`'s numbers, both fidelities."""

from __future__ import annotations

import json

import pytest

from dashboard import projection
from dashboard.pages import whatif
from results.store import Store
from sidco.cli import main

SCENARIO = {"gpus_per_node": "8", "batch_size": "4", "parallel": "hsdp", "shard_size": "4", "micro_batch": "2",
            "reduce_dtype": "bf16", "param_dtype": "bf16", "checkpointing": True}
FLAGS = ["--gpus-per-node", "8", "--batch-size", "4", "--parallel", "hsdp", "--shard-size", "4", "--micro-batch", "2",
         "--reduce-dtype", "bf16", "--checkpointing"]


def _controls(names, **changed):
    return projection.parse_controls("model:llama-3.2-1b", names, "0.01", "2", "10Gbit", "50us", "hierarchical",
                                     device="h100", tokens="1024", **{**SCENARIO, **changed})


def _cli(capsys, store, compressor, fidelity, *flags):
    capsys.readouterr()
    assert main(["simulate", "--model", "llama-3.2-1b", "--device", "h100", "--tokens", "1024", "--nodes", "2",
                 "--bandwidth", "10Gbit", "--latency", "50us", "--topology", "hierarchical", "--compressor", compressor,
                 *(["--density", "0.01"] if compressor == "topk" else []), "--fidelity", fidelity,
                 "--store", str(store), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_whatif_under_hsdp_equals_sidco_simulate_json(tmp_path, capsys, fidelity):
    store_path = tmp_path / "r.sqlite"
    names = ["none", "bf16", "topk"]
    with Store(store_path) as store:
        page = {row["compressor"]: row for row in projection.project(store, _controls(names), fidelity)}
    for name in names:
        cli = _cli(capsys, store_path, name, fidelity, *FLAGS)
        for key in (*projection.RESULT_KEYS, *projection.SHARDED_KEYS, "cost_source"):
            assert page[name][key] == cli[key], (name, key)
    assert page["topk"]["collective"] == "all-reduce (replicate, gradient shard)"
    assert page["none"]["iteration_s"] != _cli(capsys, store_path, "none", fidelity, "--gpus-per-node", "8",
                                               "--batch-size", "4")["iteration_s"]


def test_whatif_controls_map_to_the_same_request_as_the_flags():
    values = whatif.parallel_values(*(SCENARIO[key.removeprefix("whatif-").replace("-", "_")]
                                      for key in whatif.PARALLEL_IDS))
    request = _controls(["none"], **values)
    held = request.cluster.options["sharding"]
    assert (held.parallel, held.shard_size, held.micro_batch, held.reduce_dtype, held.checkpointing) == \
        ("hsdp", 4, 2, "bf16", True)
    assert request.cluster.options["gpus_per_node"] == 8 and request.batch_size == 4
    assert "sharding" not in _controls(["none"], parallel="ddp", shard_size="", micro_batch="", reduce_dtype="fp32",
                                       checkpointing=False).cluster.options


@pytest.mark.parametrize("changed, message", [
    ({"micro_batch": "3"}, "--micro-batch 3 must divide --batch-size 4"),
    ({"shard_size": "two"}, "--shard-size must be an integer >= 1"),
    ({"gpus_per_node": "8.5"}, "GPUs per node must be a whole number"),
    ({"parallel": "zero9"}, "zero9"),
])
def test_bad_parallel_controls_are_one_line(changed, message):
    with pytest.raises(projection.ProjectionError) as error:
        _controls(["none"], **changed)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_fsdp_refuses_a_sparsifier_on_the_page_with_the_reason(tmp_path):
    with Store(tmp_path / "r.sqlite") as store:
        rows, problems = projection.project_each(store, _controls(["none", "topk"], parallel="fsdp", shard_size=""),
                                                 "analytic")
    assert [r["compressor"] for r in rows] == ["none"]
    assert len(problems) == 1 and problems[0].startswith("topk under --parallel fsdp")


PAGE = {"whatif-source": "model:llama-3.2-1b", "whatif-compressors": ["none", "bf16"], "whatif-density": "0.01",
        "whatif-nodes": "2", "whatif-bandwidth": "10Gbit", "whatif-latency": "50us", "whatif-topology": "hierarchical",
        "whatif-calibrated": [], "whatif-device": "h100", "whatif-costs": "", "whatif-samples-per-s": "",
        "whatif-step-profile": "", "whatif-tokens": "1024", "whatif-sites": "1", "whatif-wan-bandwidth": "",
        "whatif-wan-rtt": "", "whatif-gpus-per-node": "8", "whatif-batch-size": "4", "whatif-parallel": "hsdp",
        "whatif-shard-size": "", "whatif-micro-batch": "", "whatif-reduce-dtype": "fp32", "whatif-param-dtype": "bf16",
        "whatif-checkpointing": ["on"], "whatif-des": None}
"""The What-if controls of LLaMA-3.2-1B under hsdp on 2 nodes of 8 H100s, as a browser posts them."""


def _post(tmp_path, changed: str, **values) -> dict:
    """The What-if callback's outputs (by id) for :data:`PAGE` with ``values`` (id → value), posted as
    a browser does after control ``changed`` changed, on the store ``r.sqlite`` in ``tmp_path``."""
    from dashboard.app import create_app

    app = create_app(tmp_path / "r.sqlite", cache_dir=tmp_path / "cache")
    [(key, spec)] = [(k, v) for k, v in app.callback_map.items() if "whatif-breakdown" in k]
    controls = {**PAGE, **values}
    outputs = [{"id": o.component_id, "property": o.component_property} for o in spec["output"]]
    response = app.server.test_client().post("/_dash-update-component", json={
        "output": key, "outputs": outputs, "changedPropIds": [f"{changed}.value"], "state": [],
        "inputs": [{**i, "value": controls[i["id"]]} for i in spec["inputs"]]})
    assert response.status_code == 200
    return response.get_json()["response"]


def test_the_page_callback_projects_hsdp_and_names_the_collective(tmp_path):
    """The What-if callback, posted as a browser does, with the model and the parallel controls."""
    text = json.dumps(_post(tmp_path, "whatif-parallel"), ensure_ascii=False)
    assert "2 nodes" in text and "hierarchical · hsdp" in text
    assert "replaces" in text and "all-reduce (replicate, gradient shard)" in text and "inline-error" not in text


@pytest.mark.parametrize("parallel, batch, names", [("fsdp", "1", ["none", "bf16"]),
                                                     ("hsdp", "32", ["none", "bf16", "topk"])])
def test_whatif_memory_per_gpu_equals_sidco_compare_json(tmp_path, capsys, parallel, batch, names):
    """Memory per GPU and its fit on the page are `sidco compare --json`'s, for LLaMA-3.1-8B on H100s
    (under fsdp at batch 1 every row fits; under hsdp at batch 32 none does)."""
    store_path = tmp_path / "r.sqlite"
    chosen = projection.parse_controls("model:llama-3.1-8b", names, "0.01", "4", "100Gbit", "50us", "hierarchical",
                                       device="h100", gpus_per_node="8", batch_size=batch, parallel=parallel)
    with Store(store_path) as store:
        page = {row["label"]: row for row in projection.project_each(store, chosen, "analytic")[0]}
    capsys.readouterr()
    assert main(["compare", "--model", "llama-3.1-8b", "--device", "h100", "--nodes", "4", "--gpus-per-node", "8",
                 "--bandwidth", "100Gbit", "--latency", "50us", "--topology", "hierarchical", "--parallel", parallel,
                 "--batch-size", batch, "--compressors", ",".join(names), "--densities", "0.01",
                 "--store", str(store_path), "--json"]) == 0
    cli = {row["label"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    for label, row in page.items():
        for key in projection.MEMORY_KEYS:
            assert row[key] == cli[label][key], (label, key)
    assert {row["fits"] for row in page.values()} == {batch == "1"}
    assert all(row["memory_capacity_gib"] == pytest.approx(80e9 / 2**30) for row in page.values())


def test_the_page_marks_a_row_that_does_not_fit_and_the_verdict_never_calls_it(tmp_path):
    """LLaMA-3.2-1B under DDP at batch 8 of 4096 tokens on H100s: Top-k's residual (4 bytes a parameter)
    takes it past the 74.5 GiB the others fit in; it is the fastest, and the verdict calls bf16."""
    out = _post(tmp_path, "whatif-batch-size", **{
        "whatif-compressors": ["none", "bf16", "topk"], "whatif-nodes": "4", "whatif-bandwidth": "1Gbit",
        "whatif-tokens": "4096", "whatif-batch-size": "8", "whatif-parallel": "ddp", "whatif-checkpointing": []})
    table = json.dumps(out["whatif-quality"], ensure_ascii=False)
    cells = [c["props"]["children"] for c in _cells(out["whatif-quality"]["children"])]
    assert "GiB per GPU (of 74.5)" in table and "77.3 ✗ does not fit" in cells and "72.7" in cells
    verdict = json.dumps(out["whatif-verdict"], ensure_ascii=False)
    assert "bf16 wins" in verdict and "does not fit in one GPU's memory: topk@0.01" in verdict


def _cells(node):
    """Every table cell (``Td``) under a Dash component tree as JSON."""
    if isinstance(node, list):
        return [cell for child in node for cell in _cells(child)]
    if not isinstance(node, dict):
        return []
    found = [node] if node.get("type") == "Td" else []
    return found + _cells(node.get("props", {}).get("children"))


def test_the_sweeps_page_names_the_parallel_family_sidco_sweep_stored(tmp_path, capsys):
    """The Sweeps page's sweep list reads the --parallel family back from the store and names it as
    `sidco sweep --json` does; a plain DDP sweep names none."""
    from dashboard.pages import sweeps

    store_path = tmp_path / "r.sqlite"
    summaries = []
    for flags in (["--parallel", "hsdp", "--micro-batch", "2", "--checkpointing"], []):
        capsys.readouterr()
        assert main(["sweep", "--model", "llama-3.2-1b", "--device", "h100", "--nodes", "2", "--gpus-per-node", "8",
                     "--bandwidth", "10Gbit", "--batch-size", "4", "--compressors", "none", "--jobs", "1",
                     "--no-progress", "--store", str(store_path), "--json", *flags]) == 0
        summaries.append(json.loads(capsys.readouterr().out))
    with Store(store_path) as store:
        labels = {option["value"]: option["label"] for option in sweeps._sweep_options(store)}
    sharded, plain = summaries
    assert f" · {sharded['parallel']} · " in labels[sharded["sweep_id"]]
    assert sharded["parallel"] == "--parallel hsdp --micro-batch 2 --checkpointing"
    assert "--parallel" not in labels[plain["sweep_id"]] and "--checkpointing" not in labels[plain["sweep_id"]]


def _stored_step(store: Store, path) -> int:
    """A step of LLaMA-3.2-1B timed on an H100 at batch 4 of 1024 tokens (numbers as `sidco profile
    --model` records them), stored as `sidco profile` stores it and written as its --out file."""
    from dataclasses import asdict

    from costs import anchor
    from traces import llm

    profile = anchor.StepProfile(model="llama-3.2-1b", config=asdict(llm.load("llama-3.2-1b")), device="h100",
                                 precision="amp", parallel="ddp", batch_size=4, tokens=1024, step_s=0.05,
                                 step_min_s=0.048, step_max_s=0.056, layers=16, layers_timed=16, scale=1.0, warmup=3,
                                 repeats=10, created="2026-12-07", source="sidco profile --model on NVIDIA H100")
    profile.save(path)
    return store.add_step_profile("llama-3.2-1b", "h100", "amp", 4, 1024, 0.05, profile.to_json())


def test_a_stored_step_profile_on_the_page_gives_sidco_simulate_step_profiles_numbers(tmp_path, capsys):
    """The page offers the step profiles the store holds (no typed path); one chosen anchors compute
    as `sidco simulate --step-profile FILE` of the same profile does, under hsdp, both fidelities."""
    store_path = tmp_path / "r.sqlite"
    with Store(store_path) as store:
        step_id = _stored_step(store, tmp_path / "step.json")
        options = projection.step_options(store)
        assert options[0]["value"] == "" and options[1]["value"] == str(step_id)
        assert "llama-3.2-1b on h100, batch 4 × 1024 tokens, amp, 50 ms" in options[1]["label"]
        chosen = _controls(["none", "bf16"], step_profile=projection.stored_step(store, str(step_id)))
        page = {row["compressor"]: row for row in projection.project(store, chosen, "analytic")}
    for name in ("none", "bf16"):
        cli = _cli(capsys, store_path, name, "analytic", *FLAGS, "--step-profile", str(tmp_path / "step.json"))
        for key in (*projection.RESULT_KEYS, *projection.SHARDED_KEYS, "compute_from"):
            assert page[name][key] == cli[key], (name, key)
    assert page["none"]["compute_from"] == "profiled"
    assert "sidco profile --model, llama-3.2-1b on h100 (2026-12-07)" in page["none"]["compute_source"]


def test_a_stored_step_profile_off_the_projection_or_missing_is_one_line(tmp_path):
    with Store(tmp_path / "r.sqlite") as store:
        step = projection.stored_step(store, str(_stored_step(store, tmp_path / "step.json")))
        with pytest.raises(projection.ProjectionError) as error:
            _controls(["none"], batch_size="8", micro_batch="", step_profile=step)
        assert "was measured with --batch-size 4, the projection asks 8" in str(error.value)
        with pytest.raises(projection.ProjectionError) as error:
            projection.stored_step(store, "7")
        assert str(error.value).startswith("no step profile #7 in ") and "\n" not in str(error.value)


def test_the_page_offers_the_stored_step_profiles_and_projects_on_the_one_chosen(tmp_path):
    """The measured-step dropdown lists the store's step profiles; choosing one, the page's compute
    comes from it (as --step-profile's), and an id the store lacks is one inline line."""
    from plotly.utils import PlotlyJSONEncoder

    from dashboard.data import StoreReader
    from dashboard.pages import whatif

    with Store(tmp_path / "r.sqlite") as store:
        step_id = _stored_step(store, tmp_path / "step.json")
    page = json.dumps(whatif.layout(StoreReader(tmp_path / "r.sqlite")), cls=PlotlyJSONEncoder, ensure_ascii=False)
    assert f"step #{step_id}: llama-3.2-1b on h100" in page
    chosen = json.dumps(_post(tmp_path, "whatif-step-profile", **{"whatif-step-profile": str(step_id)}),
                        ensure_ascii=False)
    assert "sidco profile --model, llama-3.2-1b on h100 (2026-12-07)" in chosen and "inline-error" not in chosen
    missing = json.dumps(_post(tmp_path, "whatif-step-profile", **{"whatif-step-profile": "99"}), ensure_ascii=False)
    assert "no step profile #99 in " in missing and "inline-error" in missing
