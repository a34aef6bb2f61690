"""Device profiles shipped with the testbed: ``profiles/<device>.json`` in the format of
:mod:`simulator.device_profile`, each saying in its ``source`` how and when it was measured.

A shipped CPU profile is named after the CPU it was measured on (``cpu-<model>.json``) and is
used for ``--device cpu`` only on a host with the same CPU model and SIMD flags.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def paths() -> list[Path]:
    """Every shipped profile file, sorted by name."""
    return sorted(HERE.glob("*.json"))
