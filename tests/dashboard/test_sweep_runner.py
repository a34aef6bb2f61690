"""A sweep launched from the dashboard that waits on another run of the same sweep says so: on
whom it waits and until when, the line the Sweeps page's status shows."""

from __future__ import annotations

import pytest

from dashboard import sweep_runner
from results.store import Store
from simulator.sweep import scenario_key


class _Stop(Exception):
    pass


def test_a_dashboard_sweep_waiting_on_another_run_reports_it(tmp_path):
    path = tmp_path / "s.sqlite"
    spec = sweep_runner.parse_spec("layout:resnet50", ["topk"], "0.1", "2", "1Gbit", "10us", "ring")
    created: list[int] = []

    def stop_once_created(sweep_id: int) -> None:
        created.append(sweep_id)
        raise _Stop

    with pytest.raises(_Stop):
        sweep_runner.run(path, spec, started=stop_once_created)
    sweep_id = created[0]
    keys = [scenario_key(point) for point in spec.grid.points()]
    with Store(path) as other:
        assert other.claim_scenarios(sweep_id, keys, "another run") == set(keys)  # a live run holds them all
    said: list[str] = []

    def waiting(text: str) -> None:
        said.append(text)
        with Store(path) as other:  # the other run ends without them: this one takes them over
            other.release_claims(sweep_id, "another run")

    landed: list[tuple[int, int]] = []
    assert sweep_runner.run(path, spec, lambda done, total: landed.append((done, total)), waiting=waiting) == sweep_id
    assert len(said) == 1 and said[0].startswith(f"sweep {sweep_id}: waiting for {len(keys)} scenario(s)")
    assert "held by pid" in said[0] and "taken over at" in said[0]
    assert landed[-1] == (len(keys), len(keys))
