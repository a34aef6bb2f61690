"""The one compression-profile policy (pipeline.costs): file, then replays, then device profiles, else an error."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces
from costs import devices
from pipeline import costs, replay
from pipeline.costs import MissingCosts, compression_profile
from results.store import Store
from sidco.cli import main


def _rows(compressor: str, density: float, per_element_s: float, workers: int = 2) -> list[dict]:
    """Replay-shaped rows of one bucket size: compress takes per_element_s · numel seconds."""
    numel = 10_000
    selected = max(1, round(density * numel))
    return [{"compressor": compressor, "density": density, "error_feedback": 1, "iteration": 0, "worker": w,
             "bucket": 0, "numel": numel, "selected": selected, "achieved_density": selected / numel,
             "achieved_over_target": selected / numel / density, "threshold": None, "stages": None,
             "compress_s": per_element_s * numel, "decompress_s": 1e-6, "wire_bytes": 8 * selected, "rel_error": 0.5}
            for w in range(workers)]


def _replay(store: Store, trace_id: int, tag: str, device: str, rows: list[dict]) -> int:
    replay_id, _ = store.get_or_create("replays", {"tag": tag}, trace_id=trace_id, device=device)
    store.add_replay_rows(replay_id, rows)
    store.set_status("replays", replay_id, "done")
    return replay_id


@pytest.fixture
def trace_id(store, tmp_path) -> int:
    return store.register_trace(tmp_path / "t", {"workload": "w", "workers": 2, "iterations": [0]})


def test_newest_replay_wins_per_pair_and_older_replays_fill_the_rest(store, trace_id):
    old = _replay(store, trace_id, "old", "cpu", _rows("topk", 0.01, 3e-9) + _rows("dgc", 0.001, 5e-9))
    new = _replay(store, trace_id, "new", "cpu", _rows("topk", 0.01, 2e-9))
    _replay(store, trace_id, "gpu", "cuda: NVIDIA H200", _rows("dgc", 0.001, 1e-12))  # newest, other device
    # a density that is not bit-equal to the stored one still matches (canonical key)
    profile = compression_profile(store, trace_id=trace_id, device=devices.get("cpu"),
                                  pairs=[("topk", 0.01), ("dgc", 0.1 * 0.01), ("none", None)])
    topk, dgc = profile.cost("topk", 0.01), profile.cost("dgc", 0.001)
    assert topk.compress_per_element_s == pytest.approx(2e-9) and topk.source.startswith(f"replay #{new} cpu ")
    assert dgc.compress_per_element_s == pytest.approx(5e-9) and dgc.source.startswith(f"replay #{old} cpu ")
    assert topk.wire_per_element == pytest.approx((0.08, 0.08))
    on_gpu = compression_profile(store, trace_id=trace_id, device=devices.get("h200"), pairs=[("dgc", 0.001)])
    assert on_gpu.cost("dgc", 0.001).compress_per_element_s == pytest.approx(1e-12)


def test_device_profile_fills_layouts_with_a_fit_of_its_rows(store):
    # compress_s = 1e-5 s + 2e-9 s/element, exactly; the fit must recover both
    rows = [{"compressor": "topk", "density": 0.01, "numel": n, "compress_s": 1e-5 + 2e-9 * n,
             "decompress_s": 4e-10 * n} for n in (10_000, 100_000, 1_000_000)]
    store.add_device_profile("cpu", {"cpu": "test"}, "measured", rows[:1])  # older, superseded
    store.add_device_profile("cpu", {"cpu": "test"}, "measured", rows)
    cost = compression_profile(store, trace_id=None, device=devices.get("cpu"), pairs=[("topk", 0.01)]).cost("topk", 0.01)
    assert cost.compress_fixed_s == pytest.approx(1e-5, rel=1e-6)
    assert cost.compress_per_element_s == pytest.approx(2e-9, rel=1e-6)
    assert cost.decompress_per_element_s == pytest.approx(4e-10, rel=1e-6)
    # no wire_bytes stored: k = round(δ·n) values + int32 indices, 8 bytes each
    assert cost.wire_per_element == pytest.approx((0.08,))
    assert cost.source.startswith("measured cpu ")


def test_replay_rows_come_before_a_device_profile(store, trace_id):
    store.add_device_profile("cpu", {}, "measured", [{"compressor": "topk", "density": 0.01, "numel": 10_000,
                                                     "compress_s": 1.0, "decompress_s": 1.0}])
    _replay(store, trace_id, "r", "cpu", _rows("topk", 0.01, 2e-9))
    profile = compression_profile(store, trace_id=trace_id, device=devices.get("cpu"), pairs=[("topk", 0.01)])
    assert profile.cost("topk", 0.01).compress_per_element_s == pytest.approx(2e-9)


def test_profile_file_comes_first_and_is_checked(store, trace_id, tmp_path):
    _replay(store, trace_id, "r", "cpu", _rows("topk", 0.01, 2e-9) + _rows("dgc", 0.01, 3e-9))
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"device": "cpu", "source": "colleague's box", "rows": [
        {"compressor": "topk", "density": 0.01, "numel": 1000, "compress_s": 7e-6, "decompress_s": 1e-6,
         "wire_bytes": 123}]}))
    profile = compression_profile(store, trace_id=trace_id, device=devices.get("cpu"), pairs=[("topk", 0.01), ("dgc", 0.01)],
                                  profile_file=path)
    assert profile.cost("topk", 0.01).compress_per_element_s == pytest.approx(7e-9)
    assert profile.cost("topk", 0.01).wire_per_element == pytest.approx((0.123,))
    assert profile.cost("topk", 0.01).source == "file costs.json: colleague's box"
    assert profile.cost("dgc", 0.01).source.startswith("replay #")
    with pytest.raises(ValueError, match="for device 'cpu', the projection is for 'h200'"):
        compression_profile(store, trace_id=trace_id, device=devices.get("h200"), pairs=[("topk", 0.01)], profile_file=path)
    path.write_text(json.dumps({"device": "cpu", "rows": [{"compressor": "topk", "density": 0.01}]}))
    with pytest.raises(ValueError, match="not a compression profile file") as info:
        compression_profile(store, trace_id=trace_id, device=devices.get("cpu"), pairs=[("topk", 0.01)], profile_file=path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_costs_name_the_command_that_measures_them(store, trace_id, tmp_path):
    """A device the cost model does not know (plain cuda) and that nothing measured."""
    with pytest.raises(MissingCosts) as info:
        compression_profile(store, trace_id=trace_id, device=devices.unrecorded_gpu(), pairs=[("topk", 0.01), ("dgc", 0.001)])
    message = str(info.value)
    assert message.startswith("no compression costs for topk@0.01 on cuda: run `sidco replay ")
    assert f"{tmp_path / 't'} --compressors dgc,topk --densities 0.001,0.01 --run-on cuda`" in message
    assert "`sidco profile --run-on cuda`" in message and "\n" not in message
    with pytest.raises(MissingCosts, match=r"layouts have no gradients"):
        compression_profile(store, trace_id=None, device=devices.unrecorded_gpu(), pairs=[("topk", 0.01)])


def test_a_new_tier_is_one_entry(store, monkeypatch):
    from costs.profile import CompressionCost

    def model(request, missing):
        return {key: CompressionCost(0.0, 1e-9, 0.0, 1e-10, (0.08,), f"model {request.device}") for key in missing}

    monkeypatch.setattr(costs, "TIERS", [*costs.TIERS, ("model", model)])
    profile = compression_profile(store, trace_id=None, device=devices.get("a100"), pairs=[("topk", 0.01)])
    assert profile.cost("topk", 0.01).source == "model a100"


def test_real_replay_feeds_the_policy(store, tmp_path):
    trace = traces.synthetic(tmp_path / "lap", "laplace", 20_000, workers=2, iterations=2, seed=0)
    done = replay.run(store, trace.path, ["topk"], [0.01], threads=1)
    trace_id = store.trace_id_for_path(str(trace.path.resolve()))
    cost = compression_profile(store, trace_id=trace_id, device=devices.get("cpu"), pairs=[("topk", 0.01)]).cost("topk", 0.01)
    assert cost.source.startswith(f"replay #{done.replay_id} cpu")
    assert cost.wire_per_element == pytest.approx((0.08, 0.08))  # exactly k = 200 of 20,000, 8 bytes each
    assert cost.compress_per_element_s > 0


def test_simulate_on_a_layout_never_times_compressors(tmp_path, capsys):
    """A layout runs on a GPU (a100 by default): its costs come from the cost model of that GPU
    until a measured profile of that GPU exists, which then wins; nothing is timed."""
    argv = ["simulate", "--layout", "resnet50", "--nodes", "8", "--bandwidth", "10Gbit", "--compressor", "topk",
            "--density", "0.01", "--store", str(tmp_path / "r.sqlite"), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["device"] == "a100" and result["cost_source"] == "model a100"
    with Store(tmp_path / "r.sqlite") as store:
        store.add_device_profile("a100", {}, "measured", [
            {"compressor": "topk", "density": 0.01, "numel": n, "compress_s": 2e-11 * n, "decompress_s": 1e-12 * n}
            for n in (1 << 20, 1 << 22)])
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cost_source"].startswith("measured a100 ") and result["compress_s"] > 0
    assert main(argv + ["--device", "h200"]) == 0
    assert json.loads(capsys.readouterr().out)["cost_source"] == "model h200"


def test_emulation_projections_replay_the_run_trace_into_the_store(store, tmp_path):
    from pipeline.emulate import validation_rows

    trace = traces.synthetic(tmp_path / "run", "laplace", 20_000, workers=1, iterations=2, seed=0,
                             timings={"forward_s": 0.01, "backward_s": [0.02], "optimizer_s": 0.001,
                                      "batch_size": 8, "device": "cpu"})
    store.register_trace(trace.path, trace.manifest)
    measured = [{"compressor": name, "trace": str(trace.path), "measured_s": 0.05} for name in ("none", "topk")]
    rows = validation_rows(store, 1, "synthetic", 2, 1e8, 0.01, measured, (None, None))
    by_name = {r["compressor"]: json.loads(r["detail_json"]) for r in rows}
    assert by_name["none"]["cost_source"] is None
    (stored,) = store.replay_list()
    assert by_name["topk"]["cost_source"].startswith(f"replay #{stored['id']} cpu")
    assert by_name["topk"]["projected"]["compress_s"] > 0


def test_simulate_on_a_trace_without_replays_takes_the_cost_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SIDCO_CACHE_DIR", str(tmp_path / "cache"))
    trace = traces.synthetic(tmp_path / "lap", "laplace", 5_000, workers=2, iterations=1, seed=0)
    assert main(["simulate", "--trace", str(trace.path), "--nodes", "4", "--bandwidth", "1Gbit", "--compressor",
                 "sidco-e", "--density", "0.01", "--store", str(tmp_path / "r.sqlite"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["device"] == "cpu" and result["cost_source"] == "model cpu (defaults)"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_SECONDS = _JSON | st.floats(min_value=0, max_value=1)
_ROW = st.fixed_dictionaries({"compressor": st.sampled_from(["topk", 3, None]),
                              "density": _JSON | st.floats(min_value=1e-4, max_value=1),
                              "numel": _JSON | st.integers(min_value=1, max_value=10**7),
                              "compress_s": _SECONDS, "decompress_s": _SECONDS})
_VALID_ROW = st.fixed_dictionaries({"compressor": st.sampled_from(["topk", "dgc"]),
                                    "density": st.floats(min_value=1e-4, max_value=1),
                                    "numel": st.integers(min_value=1, max_value=10**7),
                                    "compress_s": st.floats(0, 1), "decompress_s": st.floats(0, 1)})
_DOCUMENT = (_JSON | st.fixed_dictionaries({"device": _JSON | st.just("cpu"), "rows": st.lists(_ROW, max_size=3)})
             | st.fixed_dictionaries({"device": st.just("cpu"), "rows": st.lists(_VALID_ROW, min_size=1, max_size=4)}))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=_DOCUMENT, raw=st.binary(max_size=40))
def test_any_profile_file_gives_costs_or_one_line_naming_the_file(tmp_path, document, raw):
    path = tmp_path / "p.json"
    for content in (json.dumps(document).encode(), raw):
        path.write_bytes(content)
        try:
            found = costs.read_profile_file(path, "cpu")
        except ValueError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)
        else:
            assert found and all(cost.source.startswith("file p.json") for cost in found.values())
            for cost in found.values():
                assert cost.compress_fixed_s >= 0 and cost.compress_per_element_s >= 0
                assert all(w > 0 for w in cost.wire_per_element)
