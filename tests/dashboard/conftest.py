"""Fixtures for the dashboard tests: headless Debian chromium for dash[testing]."""

from __future__ import annotations

import pytest
from populate import populate
from selenium.webdriver.chrome.options import Options

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)


def pytest_setup_options() -> Options:
    """The dash[testing] hook: chromium options for ``dash_duo`` (root, no internet)."""
    options = Options()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    return options


@pytest.fixture(scope="session")
def populated_store(tmp_path_factory) -> dict:
    """A results store filled by the real pipeline (see populate.py): path and row ids."""
    root = tmp_path_factory.mktemp("dashboard-store")
    path = root / "results.sqlite"
    ids = populate(path, root / "trace")
    return {"path": path, **ids}
