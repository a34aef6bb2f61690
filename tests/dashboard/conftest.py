"""Fixtures for the dashboard tests: headless Debian chromium for dash[testing]."""

from __future__ import annotations

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
