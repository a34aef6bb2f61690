"""One card per compressor: the registry is the one list, every other list derives from it, and no
registered name is written out as a string literal outside compressors/, the tests and the
benchmarks but where the allowlist says why."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import compressors
from compressors.messages import wire
from compressors.work import CARDS, DECLARATIONS, FUSED, REGISTRY

ROOT = Path(__file__).resolve().parents[1]

OUTSIDE = ("compressors", "tests", "benchmarks")
"""Where a compressor's name may be written freely: its own package, the tests, the benchmarks."""

AMBIGUOUS = {"none"}
"""Names that are also ordinary words of other options (``memory="none"``, ``topology="none"``):
not searched for."""

ALLOWED: dict[str, set[str]] = {
    # defaults: what a page or a probe starts with
    "dashboard/pages/whatif.py": {"fp16", "powersgd", "topk", "dgc", "sidco-e", "sidco-p", "sidco-gp"},
    "dashboard/pages/sweeps.py": {"topk", "sidco-e"},
    "dashboard/pages/tta.py": {"topk", "sidco-e"},
    "measuring/host.py": {"gaussiank"},  # the launch probe's compressor
    # the same spelling, another thing: torch.topk the kernel, fp16/bf16 the precisions and dtypes
    "costs/costmodel.py": {"topk"},
    "costs/device_profile.py": {"topk"},
    "costs/devices.py": {"topk", "fp16", "bf16"},
    "costs/kernel_bands.py": {"topk"},
    "pipeline/bench.py": {"fp16", "bf16", "topk"},  # dtypes; Top-k, the reference of energy_vs_topk
    # the paper's compressors and the figures it reports for them
    "pipeline/paper.py": {"topk", "dgc", "sidco-e", "sidco-p", "sidco-gp"},
    "sidco/commands/paper.py": {"topk", "dgc"},
    # the fp16 bar of the What-if figure (a front door imports no compressors to ask for the baseline)
    "dashboard/figures.py": {"fp16"},
    "simulator/sharded.py": {"bf16", "fp8"},  # dtypes: the --reduce-dtype / --param-dtype table and default
    # fp8 the training precision of published runs (FP8 linear layers), not the fp8 compressor
    "costs/sharded_fit.py": {"fp8"},
    "pipeline/published_sharded.py": {"fp8"},
    # PowerSGD's rank option, keyed by its name in replay options and the quality table
    "pipeline/quality.py": {"powersgd"},
    "sidco/commands/replay.py": {"powersgd"},
}
"""File → the registered names it may write as literals, each group with its reason."""


def _literals(path: Path, wanted: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted]


def test_no_registered_name_is_written_out_of_its_home():
    wanted = set(compressors.names()) - AMBIGUOUS
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in OUTSIDE or relative.parts[0].startswith(".") or "site-packages" in relative.parts:
            continue
        allowed = ALLOWED.get(relative.as_posix(), set())
        found += [f"{relative}:{line}: {name!r}" for line, name in _literals(path, wanted) if name not in allowed]
    assert not found, "derive these from the registry (compressors.card, compressors.names) instead:\n" + "\n".join(found)


def test_the_allowlist_names_only_what_is_there():
    """No stale entry: each allowed name still appears in its file."""
    for relative, allowed in ALLOWED.items():
        present = {name for _, name in _literals(ROOT / relative, allowed)}
        assert present == allowed, (relative, allowed - present)


def test_each_card_matches_its_class_and_the_derived_lists_follow_the_cards():
    assert [c.name for c in REGISTRY] == compressors.names() == list(CARDS) == list(DECLARATIONS)
    for card in REGISTRY:
        cls = compressors.compressor_class(card.name)
        assert cls.name == card.name and cls.message == card.message
        assert cls.work is card.declared.work, card.name  # the class binds the work its card declares
        assert compressors.takes_density(card.name) == card.takes_density
        assert compressors.exchange(card.name) == wire.collective(card.name) == card.collective
        assert card.takes_density == (card.message == "sparse" and card.collective == "allgather")
        assert not card.baseline or not card.takes_density  # a baseline sends what no density sets
    assert FUSED == tuple(c.name for c in REGISTRY if c.declared.fused is not None)
    for kind in compressors.MESSAGES:
        assert compressors.names(kind) == [c.name for c in REGISTRY if c.message == kind]


def test_the_lists_the_rest_of_the_testbed_reads_come_from_the_cards():
    from costs import costmodel
    from pipeline import compare, verdict
    from simulator import sweep

    assert verdict.BASELINES == tuple(c.name for c in REGISTRY if c.baseline)
    assert compare.ALWAYS == tuple(c.name for c in REGISTRY if c.always_compared)
    assert set(compare.ALWAYS) <= set(verdict.BASELINES)
    assert sweep.RANKED == tuple(compressors.names("lowrank"))
    for card in REGISTRY:
        expected = "native" if card.native_on_cpu and importlib.import_module(
            "compressors.kernels.native_build").built() else "torch"
        assert costmodel.backend_on("cpu", card.name) == expected


def test_a_shared_seed_moves_the_message_to_an_all_reduce_and_each_bucket_draws_its_own():
    card = compressors.card("randomk")
    assert card.collective_for({}) == "allgather" and card.collective_for({"seed": 0}) == "allreduce"
    assert card.bucket_options({"seed": 5, "x": 1}, 2) == {"seed": 5 + 2 * 1_000_003, "x": 1}
    assert card.bucket_options({"seed": None}, 2) == {"seed": None}
    assert compressors.card("topk").bucket_options({"seed": 5}, 2) == {"seed": 5}
