"""Takes docs/inspector.png: the inspector on the embedded demo, in Chromium.

    uv run python -m tests.inspector.screenshot [docs/inspector.png]

What ``compaction-worker demo --inspect`` shows, captured: the embedded broker and Redis, the
demo's worker and synthetic agent, then the inspector's page of the first conversation.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from playwright.async_api import async_playwright

from compaction_worker.cli.common import embedded_infra
from compaction_worker.client.client import Client
from compaction_worker.inspector.app import serving
from compaction_worker.local.demo import run_demo
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.settings import InspectorSettings, load_settings
from tests.inspector.browser import NO_CHROMIUM, chromium_path


async def capture(out: Path) -> None:
    executable = chromium_path()
    if executable is None:
        raise SystemExit(NO_CHROMIUM)
    with embedded_infra(load_settings(), print) as embedded:
        settings = embedded.model_copy(update={"inspector": InspectorSettings(port=0)})
        await ensure_topics(settings)
        await run_demo(settings, 60, 2, 6000)
        async with (
            Client.connect(settings, kafka=False) as client,
            serving(settings, client) as url,
            async_playwright() as playwright,
        ):
            browser = await playwright.chromium.launch(executable_path=executable)
            page = await browser.new_page(viewport={"width": 1280, "height": 1400})
            await page.goto(f"{url}/c/demo-1")
            await page.locator("details.span a.to-chunk").first.click()  # a chunk open beside its span
            await page.evaluate("window.scrollTo(0, 0)")
            await page.screenshot(path=str(out))
            await browser.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(capture(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/inspector.png")))
