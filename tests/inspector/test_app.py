"""The inspector's pages over real Redis: what they list and show, escaping, GET only, the token."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from compaction_worker.client.client import Client, context_stats
from compaction_worker.errors import ConfigError
from compaction_worker.inspector.app import build_app, check_exposure, serving
from compaction_worker.inspector.counts import TranscriptCounts, light
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.settings import InspectorSettings, Settings
from compaction_worker.testing import turn_bytes
from tests.inspector.test_record import hand_until_scheduled
from tests.orchestration import Parts, all_keys, compact_now, conversation, rules_conversation, user

pytestmark = pytest.mark.integration

SCRIPT = "<script>window.pwned = 1; document.title = 'pwned'</script>"


@pytest.fixture
async def compacted(parts: Parts) -> Parts:
    """Conversation ``c`` compacted once, then a turn that holds a script; ``other`` with two turns."""
    events = conversation(80)
    handed = await hand_until_scheduled(parts.turns, events)
    await compact_now(parts.jobs, parts.compactor)
    await parts.turns.handle(turn_bytes("c", handed + 1, [user(f"look: {SCRIPT}")]), b"c")
    for seq, event in enumerate(conversation(2), start=1):
        await parts.turns.handle(event.replace(b'"c"', b'"other"', 1), b"other")
        assert (await parts.store.meta("other")).last_seq == seq
    return parts


def client_for(parts: Parts, **inspector: object) -> Client:
    settings = parts.settings.model_copy(update={"inspector": InspectorSettings.model_validate(inspector)})
    return Client(settings, parts.store, None)


@pytest.fixture
async def http(compacted: Parts) -> AsyncIterator[httpx.AsyncClient]:
    client = client_for(compacted)
    app = build_app(client.settings, client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inspector") as http:
        yield http


async def test_the_index_lists_conversations_recent_and_largest(http: httpx.AsyncClient) -> None:
    page = await http.get("/")
    assert page.status_code == 200
    assert page.text.count('href="/c/c"') == 2
    assert page.text.count('href="/c/other"') == 2
    assert page.text.index('href="/c/c"') > page.text.index('href="/c/other"')  # most recent first
    assert "2 conversations read" in page.text


async def test_search_by_id(http: httpx.AsyncClient) -> None:
    page = await http.get("/", params={"q": "oth"})
    assert 'href="/c/other"' in page.text
    assert 'href="/c/c"' not in page.text
    exact = await http.get("/", params={"q": "other"})
    assert "Open <code>other</code>" in exact.text
    glob = await http.get("/", params={"q": "*"})
    assert "0 conversations read" in glob.text  # matched literally, not as a pattern


async def test_the_conversation_page_shows_every_section(http: httpx.AsyncClient, compacted: Parts) -> None:
    page = await http.get("/c/c")
    assert page.status_code == 200
    snapshot = await compacted.store.snapshot("c")
    (chunk,) = snapshot.history.chunks
    text = page.text
    stats = context_stats("c", snapshot.meta, compacted.settings)
    gauge = f'<meter id="gauge" min="0" max="{stats.window}" low="{stats.target}" high="{stats.threshold}"'
    assert gauge in text
    assert f'value="{stats.tokens}"' in text
    assert text.count('class="marker"') == 1
    assert 'id="compaction-v1"' in text
    assert 'href="#chunk-1">chunk 1</a></summary>' in text
    assert 'id="chunk-1"' in text
    assert f"turns {chunk.first_seq}\u2013{chunk.last_seq}" in text
    assert "compaction-worker conversation rewind c --version 1" in text
    assert f'id="msg-{snapshot.meta.msg_count}"' in text  # the whole transcript is there
    for item in chunk.artifacts[:3]:
        assert item.partition(": ")[2] in text.replace("&#39;", "'").replace("&#34;", '"').replace(
            "&amp;", "&"
        )


async def test_a_threshold_a_floor_moved_up_is_shown_with_why(parts: Parts) -> None:
    """Invariant 14: where what never compacts exceeds the target, the page shows the threshold
    moved up to where a compaction pays, and the numbers of why, as the run's event said them."""
    for event in rules_conversation(950, 2):
        await parts.turns.handle(event, b"c")
    done = await compact_now(parts.jobs, parts.compactor)  # saves too little: a no-op that finds the floor
    meta = await parts.store.meta("c")
    stats = context_stats("c", meta, parts.settings)
    assert stats.floor_tokens == meta.floor_tokens > stats.target
    assert stats.moved_threshold == -(-meta.floor_tokens * 10 // 9) > stats.threshold  # floor / 0.9
    assert stats.threshold_note is not None
    assert done.error is not None
    assert stats.threshold_note in done.error
    assert not stats.should_compact  # over the threshold, under the moved one
    client = client_for(parts)
    app = build_app(client.settings, client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inspector") as http:
        text = (await http.get("/c/c")).text
        listed = (await http.get("/")).text
    assert (
        f'<b id="moved-threshold">{stats.moved_threshold:,}</b> (moved up from {stats.threshold:,})' in text
    )
    assert f'<p class="muted" id="threshold-note">{stats.threshold_note}</p>' in text
    assert f'high="{stats.moved_threshold}"' in text
    assert f'high="{stats.moved_threshold}"' in listed


async def test_a_message_pinned_later_is_marked(http: httpx.AsyncClient, compacted: Parts) -> None:
    """Issue 37: a message pinned with ``Client.pin`` says so beside it in the transcript."""
    meta = await compacted.store.meta("c")
    await client_for(compacted).pin("c", meta.last_seq)

    text = (await http.get("/c/c")).text

    assert f'id="msg-{meta.msg_count}"' in text
    assert '<div class="edited">in the history: pinned</div>' in text


async def test_conversation_content_is_escaped(http: httpx.AsyncClient) -> None:
    page = await http.get("/c/c")
    assert SCRIPT not in page.text
    assert "&lt;script&gt;window.pwned = 1; document.title = &#39;pwned&#39;&lt;/script&gt;" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_an_unknown_conversation_is_a_404(http: httpx.AsyncClient) -> None:
    page = await http.get("/c/%3Cb%3Enope")
    assert page.status_code == 404
    assert "&lt;b&gt;nope" in page.text


async def test_only_reads(http: httpx.AsyncClient, compacted: Parts) -> None:
    before = await compacted.store.meta("c")
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in ("/", "/c/c", "/static/inspector.css"):
            assert (await http.request(method, path)).status_code == 405, (method, path)
    assert await compacted.store.meta("c") == before


async def test_a_token_is_asked_for_and_traded_for_a_cookie(compacted: Parts) -> None:
    client = client_for(compacted, token=SecretStr("s3cret"))
    app = build_app(client.settings, client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inspector") as http:
        assert (await http.get("/c/c")).status_code == 401
        assert (await http.get("/c/c", headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await http.get("/c/c", headers={"Authorization": "Bearer s3cret"})).status_code == 200
        assert (await http.get("/c/c", params={"token": "wrong"})).status_code == 401
        traded = await http.get("/c/c", params={"token": "s3cret", "x": "1"})
        assert traded.status_code == 303
        assert traded.headers["location"] == "/c/c?x=1"
        assert "httponly" in traded.headers["set-cookie"].lower()
        assert (await http.get("/c/c")).status_code == 200  # the cookie now


def test_it_will_not_listen_beyond_loopback_without_a_token() -> None:
    check_exposure(InspectorSettings())
    check_exposure(InspectorSettings(host="::1"))
    check_exposure(InspectorSettings(host="0.0.0.0", token=SecretStr("t")))
    for host in ("0.0.0.0", "192.168.1.5", "inspector.example.com"):
        with pytest.raises(ConfigError, match="without a token"):
            check_exposure(InspectorSettings(host=host))


async def test_serving_refuses_before_listening(parts: Parts) -> None:
    client = client_for(parts, host="0.0.0.0", port=0)
    with pytest.raises(ConfigError):
        async with serving(client.settings, client):
            pass


def test_the_settings_default_to_loopback() -> None:
    assert Settings().inspector.host == "127.0.0.1"
    assert Settings().inspector.token is None


# --- a long conversation: one page of its transcript ---------------------------------------

LONG = 1200
"""Turns of the long conversation: 2,400 messages, ~860 KB of transcript records."""
PAGE_BOUND = 600_000
"""Bytes a conversation page stays under with 300 messages a page, whatever the transcript's length."""


_LONG_KEYS: dict[bytes, tuple[int, bytes]] = {}
"""The long conversation's keys once built in this test process: each key's TTL and DUMP."""


@pytest.fixture
async def long(parts: Parts) -> Parts:
    """Conversation ``long`` of ``LONG`` turns with tool calls, compacted each time it crossed its threshold.

    Built through the worker's own turn path and compactor once per test process (~45 s), then
    restored key by key (DUMP/RESTORE) for the next test that asks for it.
    """
    redis = parts.store.redis
    if _LONG_KEYS:
        for key, (ttl, dumped) in _LONG_KEYS.items():
            await redis.restore(key, max(ttl, 0), dumped, replace=True)
        return parts
    for event in synthetic_turns("long", LONG, context_window=32000, seed=3, tool_output_words=(20, 60)):
        handled = await parts.turns.handle(event.model_dump_json(exclude_none=True).encode(), b"long")
        if handled.scheduled is not None:
            await compact_now(parts.jobs, parts.compactor, "long")
    assert len((await parts.store.snapshot("long")).history.chunks) >= 1
    async for key in redis.scan_iter(match="*"):
        blob = await redis.dump(key)
        if blob is not None:
            _LONG_KEYS[key] = (int(await redis.pttl(key)), blob)
    return parts


def app_for(parts: Parts, **inspector: object) -> httpx.AsyncClient:
    client = client_for(parts, **inspector)
    transport = httpx.ASGITransport(app=build_app(client.settings, client))
    return httpx.AsyncClient(transport=transport, base_url="http://inspector")


def messages_on(page: str) -> list[int]:
    return [int(n) for n in re.findall(r'id="msg-(\d+)"', page)]


@pytest.mark.slow
async def test_a_long_conversations_page_is_bounded(long: Parts) -> None:
    meta = await long.store.meta("long")
    whole = sum(len(json.dumps(r)) for r in await long.store.transcript("long"))
    async with app_for(long) as http:
        page = await http.get("/c/long")
    assert page.status_code == 200
    assert len(page.content) < PAGE_BOUND < whole  # the transcript alone would not fit
    assert messages_on(page.text) == list(range(meta.msg_count - 299, meta.msg_count + 1))
    assert f"{meta.msg_count} messages in the transcript" in page.text
    # The sawtooth still has every turn: a marker per committed compaction.
    assert page.text.count('class="marker"') == meta.version


@pytest.mark.slow
async def test_paging_links_lead_through_the_transcript(long: Parts) -> None:
    total = (await long.store.meta("long")).msg_count
    async with app_for(long, page_messages=100) as http:
        newest = (await http.get("/c/long")).text
        assert messages_on(newest) == list(range(total - 99, total + 1))
        assert 'class="newer"' not in newest
        older = (await http.get(link(newest, "older"))).text
        assert messages_on(older) == list(range(total - 199, total - 99))
        assert link(older, "newer") == "/c/long"
        oldest = (await http.get(link(newest, "oldest"))).text
        assert messages_on(oldest) == list(range(1, 101))
        assert 'class="older"' not in oldest
        second = (await http.get(link(oldest, "newer"))).text
        assert messages_on(second) == list(range(101, 201))
        for nonsense in ("nonsense", "²", "-5", "9" * 5000):
            assert messages_on((await http.get("/c/long", params={"at": nonsense})).text) == messages_on(
                newest
            )


@pytest.mark.slow
async def test_a_span_across_a_page_edge_stays_collapsed(long: Parts) -> None:
    chunk = (await long.store.snapshot("long")).history.chunks[0]
    at = chunk.first_n + 5
    assert all(chunk.covers(n) for n in range(at - 1, at + 11))
    async with app_for(long, page_messages=10) as http:
        page = (await http.get("/c/long", params={"at": at})).text
    assert messages_on(page) == list(range(at, at + 10))
    (span,) = re.findall(r'<details class="span" id="span-1-(\d+)">(.*?)</details>', page, re.S)
    assert int(span[0]) == at
    assert messages_on(span[1]) == list(range(at, at + 10))  # every message of the page, behind the link
    assert 'href="#chunk-1">chunk 1</a>' in span[1]
    assert (
        f'class="span-older" href="/c/long?at={(chunk.first_n - 1) // 10 * 10 + 1}#msg-{chunk.first_n}"'
        in span[1]
    )
    assert f'class="span-newer" href="/c/long?at={at + 10}#msg-{at + 10}"' in span[1]


@pytest.mark.slow
async def test_a_chunks_link_to_a_turn_on_an_older_page_leads_there(long: Parts) -> None:
    chunk = (await long.store.snapshot("long")).history.chunks[0]
    async with app_for(long, page_messages=100) as http:
        newest = (await http.get("/c/long")).text
        assert f'id="msg-{chunk.first_n}"' not in newest
        found = re.search(rf'href="([^"]*#msg-{chunk.first_n})">#{chunk.first_n}</a>', newest)
        assert found is not None
        target, anchor = found.group(1).split("#")
        assert target.startswith("/c/long?at=")
        there = (await http.get(target)).text
    assert f'id="{anchor}"' in there
    held = re.search(
        rf'<details class="span" id="span-1-\d+">((?:(?!</details>).)*id="{anchor}")', there, re.S
    )
    assert held is not None  # inside its collapsed span, which the page's script opens for the anchor


def link(page: str, name: str) -> str:
    found = re.search(rf'<a class="{name}" href="([^"]+)"', page)
    assert found is not None, name
    return found.group(1).replace("&amp;", "&")


async def test_the_sawtooths_counts_are_read_once_then_extended(parts: Parts) -> None:
    """The cached counts equal a full read after the transcript grew, and after it began again."""
    counts = TranscriptCounts(parts.store)
    events = conversation(30)
    for event in events[:10]:
        await parts.turns.handle(event, b"c")
    assert await counts.read("c") == [light(r) for r in await parts.store.transcript("c")]
    for event in events[10:]:
        await parts.turns.handle(event, b"c")
    assert len(await counts.read("c")) == 30
    assert await counts.read("c") == [light(r) for r in await parts.store.transcript("c")]
    await parts.store.redis.delete(*await all_keys(parts.store.redis, "*"))  # expired, then begun again
    for event in events[:12]:
        await parts.turns.handle(event.replace(b"question", b"query"), b"c")
    assert await counts.read("c") == [light(r) for r in await parts.store.transcript("c")]
    assert len(await counts.read("c")) == 12
