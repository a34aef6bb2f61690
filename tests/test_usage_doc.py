"""The manual names every option: each flag of each ``sidco`` subcommand appears in docs/usage.md."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from sidco.cli import build_parser

USAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"


def _flags() -> dict[str, list[str]]:
    """Every documented option string of every subcommand (renamed spellings, hidden from
    ``--help``, excluded)."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: [flag for action in command._actions if action.help != argparse.SUPPRESS
                   for flag in action.option_strings if flag.startswith("--") and flag != "--help"]
            for name, command in sub.choices.items()}


def test_every_flag_of_every_subcommand_is_in_the_manual():
    text = USAGE.read_text(encoding="utf-8")
    missing = [f"sidco {name} {flag}" for name, flags in sorted(_flags().items()) for flag in flags
               if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]
    assert not missing, "docs/usage.md lacks: " + ", ".join(missing)


def test_the_check_sees_the_flags():
    flags = _flags()
    assert "--run-on" in flags["replay"] and "--device" in flags["simulate"] and "--device" not in flags["replay"]
    assert "--calibration" in flags["emulate"] and "--densities" in flags["emulate"]


def test_benchmarks_hold_current_figures_only():
    """BENCHMARKS.md is a page of current figures (history is in git): short, nothing marked
    superseded, every section naming the commit that recorded it."""
    text = (USAGE.parent.parent / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 520 and "superseded" not in text.lower()
    sections = re.findall(r"<!-- section:(\w+) -->(.*?)<!-- /section:\1 -->", text, flags=re.S)
    assert len(sections) >= 6
    assert all("**Commit:**" in body for _, body in sections), [name for name, body in sections if "**Commit:**" not in body]
