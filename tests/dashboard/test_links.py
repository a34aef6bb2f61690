"""Pages open on the scenario their address names (the demo links to its own run and trace)."""

from __future__ import annotations

from dashboard.data import StoreReader
from dashboard.pages import tta, whatif


def _values(component, found=None) -> dict:
    found = {} if found is None else found
    if getattr(component, "id", None) is not None and hasattr(component, "value"):
        found[component.id] = component.value
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            _values(child, found)
    return found


def test_whatif_defaults_to_a_gpu_layout_and_takes_the_scenario_from_the_address(tmp_path):
    reader = StoreReader(tmp_path / "r.sqlite")
    plain = _values(whatif.layout(reader))
    assert plain["whatif-source"] == "layout:bert-base" and plain["whatif-bandwidth"] == "10Gbit"
    linked = _values(whatif.layout(reader, query={"source": "layout:gpt2", "nodes": "32", "bandwidth": "1Gbit",
                                                  "density": "0.001", "device": "h100"}))
    assert (linked["whatif-source"], linked["whatif-nodes"], linked["whatif-bandwidth"], linked["whatif-density"],
            linked["whatif-device"]) == ("layout:gpt2", "32", "1Gbit", "0.001", "h100")
    unknown = _values(whatif.layout(reader, query={"source": "trace:999", "device": "tpu"}))
    assert unknown["whatif-source"] == "layout:bert-base" and unknown["whatif-device"] == ""


def test_tta_takes_cluster_and_target_from_the_address(tmp_path):
    reader = StoreReader(tmp_path / "r.sqlite")
    linked = _values(tta.layout(reader, query={"nodes": "8", "bandwidth": "100Mbit", "target": "0.25"}))
    assert (linked["tta-nodes"], linked["tta-bandwidth"], linked["tta-target"]) == ("8", "100Mbit", "0.25")


def test_notes_keep_urls_and_cut_server_paths():
    """The Timeline note names chrome://tracing intact; absolute server paths are still cut."""
    from dashboard import components

    note = "Open the file at ui.perfetto.dev or chrome://tracing."
    assert components.public_message(note) == note
    assert components.public_message("see https://ui.perfetto.dev/#!/viewer") == "see https://ui.perfetto.dev/#!/viewer"
    assert components.public_message("cannot read /root/runs/x.sqlite") == "cannot read …/x.sqlite"

