"""The SIDCo paper's setting projected twice: with the kernel costs of its PyTorch era and with today's.

The paper (Abdelmoniem et al., MLSys 2021) trains on 8 V100 nodes over 1 and 10 Gbit/s links
and compares SIDCo-E/-P/-GP with Top-k, DGC and no compression; its code pins PyTorch 1.3,
whose ``torch.topk`` on one large slice ran in a single thread block
(:data:`costs.devices.OLD_TOPK_S_PER_ELEMENT`). :func:`project_paper` runs that grid through
the one projection (:func:`pipeline.project.project`) on ``v100@pytorch-1.3`` and on ``v100``
and reports, per setting and at the best setting, SIDCo's speed-up over each baseline (the
baseline's iteration time over the fastest SIDCo variant's) with its band, beside the figures
the paper's abstract reports. Units: seconds; speed-ups are ratios (×).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline import project, settle
from pipeline.verdict import settle_text
from results.store import Store

PAPER = {
    "nodes": 8, "device": "v100", "era": "pytorch-1.3", "bandwidths_bps": (1e9, 10e9),
    "layouts": ("resnet50", "vgg16"), "densities": (0.01, 0.001),
    "compressors": ("none", "topk", "dgc", "sidco-e", "sidco-p", "sidco-gp"),
    "bucket_mode": "single", "batch_size": 32, "precision": "fp32", "latency_s": 50e-6,
}
"""The grid: the paper's 8 V100 nodes, links, compressors and CNNs (its LSTM has no layout
here), the whole model as one bucket as its harness compresses it; batch 32 per worker and fp32
are this testbed's choices, not the paper's figures."""

REPORTED = {"none": 41.7, "topk": 7.6, "dgc": 1.9}
"""SIDCo's speed-up "up to 41.7, 7.6 and 1.9" over no compression, Top-k and DGC (the paper's
abstract, arXiv 2101.10761; text copies lose the unit: some print ×, some %)."""

SIDCO = ("sidco-e", "sidco-p", "sidco-gp")


def _ratio(base: dict[str, Any], sidco: dict[str, Any]) -> dict[str, float]:
    """Speed-up of ``sidco`` over ``base`` (iteration-time ratio) and its band (the extremes of
    the two bands, taken independently)."""
    return {"speedup": base["iteration_s"] / sidco["iteration_s"],
            "low": base["iteration_s_low"] / sidco["iteration_s_high"],
            "high": base["iteration_s_high"] / sidco["iteration_s_low"]}


def project_paper(store: Store, *, layouts: Sequence[str] = PAPER["layouts"],
                  densities: Sequence[float] = PAPER["densities"]) -> dict[str, Any]:
    """Every setting of :data:`PAPER` in both eras: ``rows`` (layout, bandwidth_bps, density,
    era, the fastest SIDCo variant and its speed-ups over ``none``, ``topk``, ``dgc`` with
    bands) and ``summary`` (per baseline: the paper's figure and the best speed-up of each era
    with its band), ``verdict`` (one sentence per baseline) and ``setting`` (:data:`PAPER`)."""
    rows, settings = [], []
    eras = {"then": f"{PAPER['device']}@{PAPER['era']}", "today": PAPER["device"]}
    for layout in layouts:
        for bandwidth in PAPER["bandwidths_bps"]:
            cluster = project.Cluster(PAPER["nodes"], bandwidth, PAPER["latency_s"], fidelity="analytic",
                                      options={"bucket_mode": PAPER["bucket_mode"]})
            for density in densities:
                for era, device in eras.items():
                    asked = project.resolve(project.Request(cluster, tuple(PAPER["compressors"]), (density,),
                                                            layout=layout, device=device,
                                                            batch_size=PAPER["batch_size"],
                                                            precision=PAPER["precision"]), store)
                    results = {r["compressor"]: r for r in project.project(store, asked)}
                    best = min(SIDCO, key=lambda name: results[name]["iteration_s"])
                    rows.append({"layout": layout, "bandwidth_bps": bandwidth, "density": density, "era": era,
                                 "device": device, "sidco": best,
                                 "iteration_s": {n: r["iteration_s"] for n, r in results.items()},
                                 **{f"over_{b}": _ratio(results[b], results[best]) for b in REPORTED}})
                    settings.append((asked, results))
    summary = {}
    for baseline, figure in REPORTED.items():
        entry: dict[str, Any] = {"paper": figure}
        for era in eras:
            i = max((i for i, r in enumerate(rows) if r["era"] == era),
                    key=lambda i: rows[i][f"over_{baseline}"]["speedup"])
            top, (asked, results) = rows[i], settings[i]
            found = settle.settle(store, asked, [results[top["sidco"]], results[baseline]])
            entry[era] = {**top[f"over_{baseline}"], "layout": top["layout"], "bandwidth_bps": top["bandwidth_bps"],
                          "density": top["density"], "sidco": top["sidco"], "settle": found}
        summary[baseline] = entry
    return {"setting": dict(PAPER), "rows": rows, "summary": summary, "verdict": verdict(summary)}


def _holds(best: dict[str, Any]) -> str:
    """Whether the band decides SIDCo's lead, what it rests on and what would change it (the
    input :func:`pipeline.settle.settle` names, with the command that measures it)."""
    if best["low"] > 1.0:
        call = "SIDCo is faster"
    elif best["high"] < 1.0:
        call = "SIDCo is slower"
    else:
        call = "undecided: the band spans 1x, so no conclusion"
    found = best.get("settle")
    return call if found is None else f"{call}; {settle_text(found)}"


def verdict(summary: dict[str, Any]) -> list[str]:
    """One sentence per baseline: the paper's figure, what each era projects at its best
    setting, whether the band decides SIDCo's lead, and the input that decides it or comes
    closest to changing it, with the measurement that would."""
    names = {"none": "no compression", "topk": "Top-k", "dgc": "DGC"}
    lines = []
    for baseline, entry in summary.items():
        then, today = entry["then"], entry["today"]
        lines.append(
            f"over {names[baseline]}: paper up to {entry['paper']:g}; PyTorch-1.3-era projection up to "
            f"{then['speedup']:.2f}x ({then['low']:.2f}-{then['high']:.2f}x; {_holds(then)}); today up to "
            f"{today['speedup']:.2f}x ({today['low']:.2f}-{today['high']:.2f}x; {_holds(today)})")
    return lines
