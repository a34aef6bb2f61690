"""Shared fixtures, environment-based skips and the hypothesis profile.

Markers: ``gpu`` (needs CUDA), ``browser`` (needs chromium + chromedriver),
``root`` (needs root plus ``ip``/``tc`` for network namespaces).

Hypothesis runs the ``repeatable`` profile by default (``derandomize``: the same examples on
every run, so a suite that passed passes again on a clean clone); ``HYPOTHESIS_PROFILE=explore``
draws new examples each run, to look for failures.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

ARTIFACTS = Path(__file__).parent / "artifacts"


def pytest_addoption(parser):
    parser.addoption("--screenshots", metavar="DIR", default=None,
                     help="where the browser tests save the dashboard's page screenshots (PNG); a temporary "
                          "directory if not given (make screenshots passes docs/screenshots)")


def _root_with_netns() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("tc"))


def pytest_collection_modifyitems(config, items):
    skips = {
        "gpu": (torch.cuda.is_available(), "no CUDA device"),
        "browser": (
            bool(shutil.which("chromium")) and bool(shutil.which("chromedriver")),
            "chromium/chromedriver not installed (make system-deps as root)",
        ),
        "root": (_root_with_netns(), "needs root with ip and tc"),
    }
    for item in items:
        for marker, (available, reason) in skips.items():
            if marker in item.keywords and not available:
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_finish(session):
    """Start the Triton-interpreter child (tests/interpreter.py) now, when a collected test reads
    it, so that it runs beside the rest of the suite rather than after it."""
    import interpreter

    def reads_it(item) -> bool:
        function = getattr(item, "function", None)
        return function is not None and "run_interpreted" in function.__code__.co_names

    if not session.config.option.collectonly and any(reads_it(item) for item in session.items):
        interpreter.start()


def pytest_sessionfinish(session):
    import interpreter

    interpreter.stop()


@pytest.fixture
def one_thread():
    """One intra-op torch thread for the test: on a small shared machine OpenMP barriers make
    tiny operations take milliseconds (modules that train or capture use it for every test)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def store(tmp_path):
    """A fresh results store in a temporary directory."""
    from results.store import Store

    s = Store(tmp_path / "results.sqlite")
    yield s
    s.close()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests save files worth keeping (screenshots, timelines)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(autouse=True)
def _no_shipped_profiles(monkeypatch):
    """In-process tests see no shipped device profiles: ``profiles/`` may hold one measured on
    this very CPU, which would take precedence over the cost model the tests expect. A test of
    the shipped tier patches ``profiles.paths`` itself."""
    import profiles

    monkeypatch.setattr(profiles, "paths", lambda: [])


@pytest.fixture(scope="session")
def resnet20_trace(tmp_path_factory):
    """A small real trace: ResNet-20 (width 0.5) trained 4 steps on the built-in images by 2
    simulated workers, steps 2 and 4 recorded (about 2 s on 2 cores). Read it, never write to it."""
    import traces

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return traces.capture("resnet20", tmp_path_factory.mktemp("resnet20") / "trace", workers=2, iterations=4,
                              every=2, width=0.5, batch_size=8)
    finally:
        torch.set_num_threads(threads)
