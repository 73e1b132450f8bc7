"""Finding a Chromium for Playwright: Debian's ``chromium`` (Playwright's own download is not used)."""

from __future__ import annotations

import os
import shutil

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """``COMPACTION_TEST_CHROMIUM``, else the first Chromium on the PATH; None when there is none."""
    configured = os.environ.get("COMPACTION_TEST_CHROMIUM")
    if configured:
        return configured
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


NO_CHROMIUM = (
    "no Chromium found for the browser tests: install Debian's (apt-get install -y chromium) "
    "or point COMPACTION_TEST_CHROMIUM at one"
)
