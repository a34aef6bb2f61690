"""``sidco sweep``'s text summary fits 120 columns: the table of each cluster's best configuration,
then each cluster's decision under it, wrapped as ``compare``'s verdict is; ``--json`` carries the
same findings in full."""

from __future__ import annotations

import json
import re

from sidco.cli import main
from sidco.commands.compare import WIDTH

SWEEP = ["sweep", "--layout", "resnet50", "--nodes", "2,16", "--bandwidth", "1Gbit,100Gbit", "--compressors",
         "topk,dgc,sidco-e", "--densities", "0.01,0.001", "--no-progress"]


def test_the_sweep_summary_fits_120_columns_with_every_clusters_verdict(tmp_path, capsys):
    store = str(tmp_path / "r.sqlite")
    assert main(SWEEP + ["--store", store, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["findings"]
    assert main(SWEEP + ["--store", store]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)
    assert max(len(line) for line in lines) > WIDTH - 20  # the long lines were wrapped, not cut short
    prose = " ".join(out.split())
    head = lines.index(next(line for line in lines if line.split()[:2] == ["#", "nodes"]))
    for number, f in enumerate(found, 1):
        row = lines[head + number].split()
        assert row[:2] == [str(number), str(f["nodes"])] and f["best"] in row
        assert f"{number} verdict: {' '.join(f['verdict']['headline'].split())}" in prose
    assert re.search(r"verdict: (compress|don't compress)", prose)
