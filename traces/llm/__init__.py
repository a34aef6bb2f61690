"""Decoder-only transformers from their Hugging Face ``config.json``: no torch, no download.

A model is named by a shipped configuration (:func:`names`: GPT-2 124M and 1.5B, Llama-3.2-1B,
Llama-3.1-8B and -70B, Mistral-7B-v0.1, Qwen2.5-7B, Mixtral-8x7B-v0.1, each in
``traces/llm/configs/`` as published, with ``_source`` citing the Hugging Face repository and file
and ``_published_parameters`` the count that repository publishes) or by the path of a config.json.
:func:`layout` gives its parameter tensors in parameter order with per-sample forward FLOPs, the
rows :func:`traces.layouts.layout` gives for a measured layout (:mod:`traces.llm.params` has the
rules); :func:`load` checks the file (:mod:`traces.llm.config`: one line naming the field).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from traces.llm.config import Config, ConfigError, check_tokens, parse, stated_tokens
from traces.llm.params import parameter_count, tensors

CONFIGS = Path(__file__).with_name("configs")
"""The shipped configurations, one ``NAME.json`` each."""

DEFAULT_TOKENS = 4096
"""Tokens per sample of a model unless ``--tokens`` says otherwise (at most its longest sequence:
1,024 for GPT-2)."""

__all__ = ["CONFIGS", "Config", "ConfigError", "DEFAULT_TOKENS", "check", "is_model", "layout", "load", "max_tokens",
           "names", "parameter_count", "published", "stated", "tensors", "tokens_of"]


def names() -> list[str]:
    """Names of the shipped models."""
    return sorted(p.stem for p in CONFIGS.glob("*.json"))


def _path(ref: str) -> Path:
    """The config file of ``ref``: a shipped model's, or ``ref`` itself."""
    return CONFIGS / f"{ref}.json" if ref in names() else Path(ref)


def is_model(ref: str) -> bool:
    """Whether ``ref`` names a shipped model or a path with a ``/`` or ending in ``.json`` (a config file)."""
    return isinstance(ref, str) and (ref in names() or "/" in ref or ref.endswith(".json"))


def check(ref: str) -> str:
    """``ref`` (a shipped model's name or a config file's path) as a projection refers to it: the
    name, or the file's absolute path, after :func:`load` checked it; ValueError (one line) otherwise."""
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"--model needs a model name ({', '.join(names())}) or a config.json path, got {ref!r}")
    if ref in names():
        load(ref)
        return ref
    path = Path(ref)
    if not path.is_file():
        raise ValueError(f"unknown model {ref!r}: no such config file, and not one of {', '.join(names())}")
    resolved = str(path.resolve())
    load(resolved)
    return resolved


@functools.lru_cache(maxsize=64)
def _read(ref: str) -> tuple[Config, dict[str, Any]]:
    path = _path(ref)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{ref}: cannot read the config ({type(exc).__name__}: {exc.strerror or exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{ref}: not JSON ({exc})") from None
    return parse(raw, str(ref)), raw


def load(ref: str) -> Config:
    """The checked :class:`Config` of ``ref`` (a shipped name or a config path; read once per process)."""
    return _read(ref)[0]


def published(ref: str) -> int | None:
    """The parameter count the model's publisher states (``_published_parameters``; ``None`` if absent)."""
    return _read(ref)[1].get("_published_parameters")


def stated(ref: str) -> int:
    """Tokens per sample of ``ref`` unless told: :data:`DEFAULT_TOKENS`, at most its longest sequence."""
    return stated_tokens(load(ref), DEFAULT_TOKENS)


def max_tokens(ref: str) -> int:
    """The longest sequence (tokens) of ``ref``: its ``max_position_embeddings`` (``n_positions``)."""
    return load(ref).positions


def tokens_of(ref: str, tokens: int | None) -> int:
    """``tokens`` checked for ``ref`` (:func:`stated` when ``None``)."""
    return stated(ref) if tokens is None else check_tokens(load(ref), tokens, ref)


@functools.lru_cache(maxsize=32)
def _layout(ref: str, tokens: int) -> tuple[dict[str, Any], ...]:
    return tuple(tensors(load(ref), tokens))


def layout(ref: str, tokens: int | None = None) -> list[dict[str, Any]]:
    """The parameter tensors of model ``ref`` in parameter order: ``name``, ``shape``, ``numel``,
    ``forward_flops`` (per sample of ``tokens`` tokens, :func:`stated` when ``None``); a fresh list each call."""
    return [dict(row) for row in _layout(ref, tokens_of(ref, tokens))]
