"""What FSDP2 sends in one optimizer step of a scaled-down model, in closed form (no torch).

:func:`scaled` shrinks a shipped model's config (:mod:`traces.llm`) to a few layers and a small
width, keeping its family, grouped-query ratio, MLP ratio, biases and tying. :func:`collectives`
lists the collectives one step of ``torch.distributed.fsdp.fully_shard`` issues on gloo when every
transformer block is one FSDP unit and the root (embeddings, final norm, LM head) another, as the
flight recorder sees them (:mod:`emulation.fsdp_worker`), each with its buffer bytes:

- forward: an all-gather of each unit's parameters, root first, then the blocks in order; each
  rank contributes its shard, every tensor's dim 0 padded to a multiple of the shard group's size
  ``S`` (``ceil(dim0 / S) · rest`` elements per tensor; FSDP2's ``_get_dim0_padded_size``);
- backward: the blocks' all-gathers again, last block first (resharded after forward; the root is
  not: FSDP2 keeps the root's parameters gathered between forward and backward);
- backward: the gradients' reduce-scatter per unit, blocks last first, then the root, of the padded
  unsharded buffer (``S`` shards). gloo has no reduce-scatter of its own: ``ProcessGroupGloo``
  carries ``reduce_scatter_tensor`` as an all-reduce of the whole buffer and keeps its shard, so
  the flight recorder logs an ``all_reduce`` of ``S`` shards on the shard group (2(S−1)/S of the
  buffer on the wire per rank, where NCCL's ring reduce-scatter sends (S−1)/S);
- HSDP only: each unit's reduced gradient shard all-reduced across the replicate group.

Bytes are fp32 (the emulation runs FSDP2 without a mixed-precision policy): :data:`ITEMSIZE`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import traces.llm
from units import check_count

MODES = ("fsdp", "hsdp")
"""``fsdp``: one shard group of all ranks; ``hsdp``: a 2-D mesh, replicate × shard."""
ITEMSIZE = 4
"""Bytes per parameter and gradient element (fp32)."""
HEAD_DIM = 16
"""Width of an attention head of a scaled-down model (elements)."""
PARAMETERS = "all-gather (parameters)"
GRADIENTS = "reduce-scatter (gradients)"
REPLICATE = "all-reduce (replicate, gradient shard)"
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")


def scaled(ref: str, layers: int, hidden: int, vocab: int, tokens: int) -> traces.llm.Config:
    """Model ``ref`` (a shipped name or config path) with ``layers`` blocks of width ``hidden``
    (a multiple of :data:`HEAD_DIM`), a vocabulary of ``vocab`` tokens and sequences of up to
    ``tokens`` tokens; the query/key-value head ratio (at most the heads there are), the MLP's width
    ratio, biases and tying kept. ValueError (one line) on sizes it cannot take."""
    config = traces.llm.load(ref)
    for name, value in (("layers", layers), ("hidden", hidden), ("vocab", vocab), ("tokens", tokens)):
        check_count(value, f"--{name}")
    if hidden % HEAD_DIM:
        raise ValueError(f"--hidden must be a multiple of {HEAD_DIM} (the head width), got {hidden}")
    if config.experts:
        raise ValueError(f"{ref} is a mixture of experts: the FSDP emulation builds dense models only")
    heads = hidden // HEAD_DIM
    kv_heads = max(1, heads // (config.heads // config.kv_heads))
    if heads % kv_heads:
        kv_heads = 1
    ffn = max(8, round(hidden * config.ffn / config.hidden / 8) * 8)
    return dataclasses.replace(config, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                               head_dim=HEAD_DIM, ffn=ffn, vocab=vocab, positions=tokens)


def units(config: traces.llm.Config) -> list[tuple[str, list[tuple[int, ...]]]]:
    """The FSDP units of ``config``: ``("root", shapes)`` (every tensor outside the blocks), then
    ``("block i", shapes)`` per block in order; shapes in parameter order."""
    groups: dict[str, list[tuple[int, ...]]] = {"root": []}
    for row in traces.llm.tensors(config, 1):
        found = _BLOCK.search(row["name"])
        groups.setdefault(f"block {found.group(1)}" if found else "root", []).append(tuple(row["shape"]))
    return list(groups.items())


def shard_numel(shapes: list[tuple[int, ...]], shard: int) -> int:
    """Elements of one rank's shard of a unit of ``shapes`` over ``shard`` ranks (dim 0 padded)."""
    return sum(math.ceil(s[0] / shard) * math.prod(s[1:]) for s in shapes)


def check_mesh(mode: str, workers: int, shard_size: int | None) -> tuple[int, int]:
    """``(replicas, shard)``: the mesh of ``mode`` on ``workers`` ranks (``shard_size`` ranks per
    shard group under hsdp, default half of them). ValueError (one line) if it does not fit."""
    if mode not in MODES:
        raise ValueError(f"unknown --parallel {mode!r} for the emulation: choose from {', '.join(MODES)}")
    if workers < 2:
        raise ValueError(f"--parallel {mode} needs at least 2 workers, got {workers}")
    if mode == "fsdp":
        if shard_size not in (None, workers):
            raise ValueError("--shard-size applies to --parallel hsdp (ranks per shard group)")
        return 1, workers
    if shard_size is None and (workers < 4 or workers % 2):
        raise ValueError(f"--parallel hsdp on {workers} workers: give --shard-size (at least 2, fewer than the "
                         "workers and dividing them; the default, half of them, needs an even count >= 4)")
    shard = workers // 2 if shard_size is None else shard_size
    if not 2 <= shard < workers or workers % shard:
        raise ValueError(f"--shard-size {shard} must be at least 2, less than and dividing the {workers} workers")
    return workers // shard, shard


LABELS = {("all_gather", "shard"): PARAMETERS, ("all_reduce", "shard"): GRADIENTS,
          ("all_reduce", "replicate"): REPLICATE}
"""What FSDP2 asked for, by what gloo ran (``op``) and on which mesh dimension (``group``)."""


def sent_bytes(op: str, buffer_bytes: float, ranks: int) -> float:
    """Bytes one rank sends in a ring ``op`` (``all_gather``: of its gathered output;
    ``all_reduce``: of its buffer) over ``ranks``: (p−1)/p of the buffer, twice for an all-reduce."""
    return (2 if op == "all_reduce" else 1) * (ranks - 1) / ranks * buffer_bytes


def annotate(row: dict[str, Any], replicas: int, shard: int) -> dict[str, Any]:
    """``row`` (``op``, ``group``, ``input_bytes``, ``output_bytes``) with its ``collective`` label
    (the op's name when FSDP2 does not issue it), ``ranks`` and ring ``sent_bytes``."""
    ranks = replicas if row["group"] == "replicate" else shard
    buffer = max(row["input_bytes"], row["output_bytes"])
    return {**row, "collective": LABELS.get((row["op"], row["group"]), row["op"]), "ranks": ranks,
            "sent_bytes": sent_bytes(row["op"], buffer, ranks)}


def collectives(config: traces.llm.Config, mode: str, workers: int, shard_size: int | None = None
                ) -> list[dict[str, Any]]:
    """The collectives of one step, in issue order per kind (module docstring): ``op`` (what gloo
    runs: ``all_gather`` or ``all_reduce``), ``group`` (``shard`` or ``replicate``), ``unit``,
    ``phase`` (``forward``/``backward``), ``input_bytes`` and ``output_bytes`` of the buffers
    (bytes), and :func:`annotate`'s ``collective``, ``ranks`` and ``sent_bytes``."""
    replicas, shard = check_mesh(mode, workers, shard_size)
    found = units(config)
    blocks = [u for u in found if u[0] != "root"]
    root = [u for u in found if u[0] == "root" and u[1]]

    def row(op: str, group: str, unit: str, phase: str, numel_in: int, numel_out: int) -> dict[str, Any]:
        return annotate({"op": op, "group": group, "unit": unit, "phase": phase, "input_bytes": numel_in * ITEMSIZE,
                         "output_bytes": numel_out * ITEMSIZE}, replicas, shard)

    out = []
    for name, shapes in root + blocks:
        n = shard_numel(shapes, shard)
        out.append(row("all_gather", "shard", name, "forward", n, shard * n))
    for name, shapes in reversed(blocks):
        n = shard_numel(shapes, shard)
        out.append(row("all_gather", "shard", name, "backward", n, shard * n))
    for name, shapes in list(reversed(blocks)) + root:
        n = shard_numel(shapes, shard)
        out.append(row("all_reduce", "shard", name, "backward", shard * n, shard * n))
        if replicas > 1:
            out.append(row("all_reduce", "replicate", name, "backward", n, n))
    return out


def totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per collective label: ``count``, ``buffer_bytes`` (the larger of input and output, summed)
    and ``sent_bytes`` (ring model, one rank) of ``rows`` (one step)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        t = out.setdefault(r["collective"], {"count": 0, "buffer_bytes": 0, "sent_bytes": 0.0})
        t["count"] += 1
        t["buffer_bytes"] += max(r["input_bytes"], r["output_bytes"])
        t["sent_bytes"] += r["sent_bytes"]
    return out
