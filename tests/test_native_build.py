"""Building the native kernels: the cache key names the CPU, and a failed build says so once."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import pytest

from compressors.kernels import native


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh build state and an empty cache directory (both restored afterwards)."""
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("SIDCO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SIDCO_NATIVE", raising=False)
    return tmp_path


def test_cache_key_names_the_cpu(fresh: Path):
    a = native.cache_path("model name: AMD EPYC; flags: sse avx2 avx512f")
    b = native.cache_path("model name: AMD EPYC; flags: sse avx2")
    assert a != b and a.parent == b.parent == fresh / "cache"
    assert native.cache_path() == native.cache_path(native.march_key())
    assert native.cache_path(native.march_key()) not in (a, b)
    identity = native.march_key()
    if Path("/proc/cpuinfo").exists():
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        model = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("model name")), None)
        if model:
            assert " ".join(model) in identity


def test_failed_build_warns_once_naming_the_compiler_error(fresh: Path, monkeypatch: pytest.MonkeyPatch):
    cc = fresh / "failing-cc"
    cc.write_text("#!/bin/sh\necho 'In file included from kernels.c:1:' >&2\n"
                  "echo 'kernels.c:3:5: error: fake compiler failure' >&2\nexit 1\n")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(cc))
    with pytest.warns(RuntimeWarning) as caught:
        assert native.library() is None
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1
    assert "kernels.c:3:5: error: fake compiler failure" in messages[0] and "torch backend" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.library() is None  # reported once: no second warning
    assert not list((fresh / "cache").glob("*.so")), "nothing half-built is cached"


def test_missing_compiler_warns(fresh: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CC", "no-such-compiler-sidco")
    with pytest.warns(RuntimeWarning, match="no C compiler 'no-such-compiler-sidco'"):
        assert native.library() is None


def test_disabled_is_silent(fresh: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SIDCO_NATIVE", "0")
    monkeypatch.setenv("CC", "no-such-compiler-sidco")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.library() is None


@pytest.mark.skipif(not os.path.exists("/usr/bin/gcc") and not os.environ.get("CC"), reason="no C compiler")
def test_build_lands_at_this_cpus_cache_path(fresh: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.library() is not None
    assert native.cache_path().exists()


def test_disabling_at_runtime_wins_over_a_built_library(monkeypatch: pytest.MonkeyPatch):
    """``SIDCO_NATIVE=0`` set after the library was built (its per-call path takes no lock)
    still turns the kernels off, and SIDCo takes the torch path."""
    import torch

    import compressors

    if native.library() is None:
        pytest.skip("no C compiler for the native kernels")
    x = torch.randn(4096)
    assert native.usable(x)
    monkeypatch.setenv("SIDCO_NATIVE", "0")
    assert native.library() is None and not native.usable(x)
    comp = compressors.create("sidco-e", 0.01)
    comp.compress(x)
    assert comp.backend == "torch"
