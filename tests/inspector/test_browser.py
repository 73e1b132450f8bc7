"""The inspector in a real browser (Chromium through Playwright) over a real worker, broker and Redis.

One conversation is run through the worker until it compacted (the fake LLM summarizes), then
a turn that holds a script; the page must load, draw a marker per compaction the events
report, open a summarized turn's chunk from its link, and show the script as text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import ChatMessage, Outcome, TurnEvent
from compaction_worker.inspector.app import serving
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.worker import build_worker
from compaction_worker.testing import FakeLLMServer
from tests.inspector.browser import NO_CHROMIUM, chromium_path
from tests.integration.helpers import compaction_events, read_topic, settle
from tests.orchestration import fake_summarizer, make_settings

CHROMIUM = chromium_path()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)]

playwright_api = pytest.importorskip(
    "playwright.async_api", reason="Playwright is not installed (the dev extra)"
)

CID = "browser-1"
TURNS = 40
WINDOW = 3000
SCRIPT = "<script>window.pwned = 1; document.title = 'pwned'</script>"
IMAGE = '<img src=x onerror="window.pwned = 2">'


@dataclass
class Inspected:
    url: str
    paged: str
    """The same conversation served with ten transcript messages a page."""
    compactions: int
    """How many ``compaction.completed`` events of the conversation reported ``compacted``."""
    browser: Any

    async def page(self, url: str | None = None) -> Any:
        """A fresh tab on the conversation's page (each check starts from the page as served)."""
        page = await self.browser.new_page(viewport={"width": 1280, "height": 900})
        response = await page.goto(f"{url or self.url}/c/{CID}")
        assert response is not None
        assert response.status == 200
        return page


@pytest.fixture
async def inspected(
    kafka_bootstrap: str, redis_url: str, make_topics: Any, fake_llm: FakeLLMServer
) -> AsyncIterator[Inspected]:
    """The conversation run through a real worker until it compacted, then served and opened in Chromium."""
    assert CHROMIUM is not None  # the module is skipped otherwise
    topics = await make_topics("turn", "started", "completed", "dlq")
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer=fake_summarizer(fake_llm),
        inspector={"port": 0},
    )
    events = synthetic_turns(CID, TURNS, context_window=WINDOW, seed=7)
    script_turn = {"role": "user", "content": f"look: {SCRIPT} {IMAGE}"}
    events.append(
        TurnEvent(
            conversation_id=CID,
            turn_seq=TURNS + 1,
            model=events[0].model,
            messages=[ChatMessage.model_validate(script_turn)],
            context_window=WINDOW,
        )
    )
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:
        for event in events:
            # One at a time, each compaction landed before the next turn: the conversation
            # crosses its threshold again and again, however fast the worker stores turns.
            await client.publish_turn(event)
            await client.wait_for(CID)
        await settle([worker], len(events))
    _, completed = compaction_events(
        await read_topic(settings, settings.topics.started),
        await read_topic(settings, settings.topics.completed),
    )
    compacted = [c for c in completed[CID] if c.outcome is Outcome.COMPACTED]
    assert len(compacted) >= 2, [(c.outcome, c.error) for c in completed[CID]]
    assert fake_llm.requests, "the LLM summarizer was never called"
    paged = settings.model_copy(
        update={"inspector": settings.inspector.model_copy(update={"page_messages": 10})}
    )
    async with (
        Client.connect(settings, kafka=False) as reader,
        serving(settings, reader) as url,
        serving(paged, reader) as paged_url,
        playwright_api.async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield Inspected(url, paged_url, len(compacted), browser)
        finally:
            await browser.close()


async def test_the_inspector_in_chromium(inspected: Inspected) -> None:
    """One worker run (the costly part) for the five checks; each check opens its own tab."""
    await page_loads_with_its_sections(inspected)
    await sawtooth_has_a_marker_per_reported_compaction(inspected)
    await summarized_turns_link_opens_its_chunk(inspected)
    await a_chunks_link_to_an_older_page_opens_the_span_there(inspected)
    await script_in_the_transcript_is_shown_as_text_and_never_runs(inspected)


async def page_loads_with_its_sections(inspected: Inspected) -> None:
    page = await inspected.page()
    assert CID in await page.title()
    for section in ("#gauge", "#chart svg", "#chunks", "#artifacts", "#rewind"):
        assert await page.locator(section).count() == 1, section
    assert await page.locator("#rewind-points code.cmd").count() == inspected.compactions


async def sawtooth_has_a_marker_per_reported_compaction(inspected: Inspected) -> None:
    page = await inspected.page()
    markers = page.locator('#chart svg g.marker[id^="compaction-v"]')
    assert await markers.count() == inspected.compactions
    tooltips = [
        await markers.nth(i).locator("title").text_content() or "" for i in range(inspected.compactions)
    ]
    assert [t.split(" (")[0] for t in tooltips] == [
        f"compaction v{v}" for v in range(1, inspected.compactions + 1)
    ]
    assert any("summarizer: openai/fake-summarizer" in t for t in tooltips), tooltips


async def summarized_turns_link_opens_its_chunk(inspected: Inspected) -> None:
    page = await inspected.page()
    link = page.locator("details.span a.to-chunk").first
    target = await link.get_attribute("href")
    assert target is not None
    chunk = page.locator(target)
    assert await chunk.evaluate("e => e.open") is False
    assert not await chunk.locator("pre.summary").is_visible()
    await link.click()
    assert await chunk.evaluate("e => e.open") is True
    assert await chunk.locator("pre.summary").is_visible()
    # And back: the chunk's link to its first message opens the collapsed span that holds it.
    first = chunk.locator('summary a[href^="#msg-"]').first
    message = page.locator(await first.get_attribute("href") or "")
    assert not await message.is_visible()
    await first.click()
    assert await message.is_visible()


async def a_chunks_link_to_an_older_page_opens_the_span_there(inspected: Inspected) -> None:
    page = await inspected.page(inspected.paged)
    link = page.locator(f'details.chunk summary a[href^="/c/{CID}?at="]').first
    href = await link.get_attribute("href") or ""
    anchor = href.partition("#")[2]
    assert anchor.startswith("msg-")
    assert await page.locator(f"#{anchor}").count() == 0  # not on the newest page
    await link.click()
    await page.wait_for_url(f"**{href}")
    message = page.locator(f"#{anchor}")
    assert await message.is_visible()  # its collapsed span opened on load
    assert await message.evaluate("e => e.closest('details.span').open") is True


async def script_in_the_transcript_is_shown_as_text_and_never_runs(inspected: Inspected) -> None:
    page = await inspected.page()
    assert await page.evaluate("window.pwned") is None
    assert await page.title() != "pwned"
    shown = page.locator("pre", has_text="window.pwned = 1")
    assert await shown.count() >= 1
    assert SCRIPT in (await shown.first.text_content() or "")
    assert IMAGE in (await shown.first.text_content() or "")
