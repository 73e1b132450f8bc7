"""The inspector's pages over real Redis: what they list and show, escaping, GET only, the token."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from compaction_worker.client.client import Client, context_stats
from compaction_worker.errors import ConfigError
from compaction_worker.inspector.app import build_app, check_exposure, serving
from compaction_worker.settings import InspectorSettings, Settings
from compaction_worker.testing import turn_bytes
from tests.inspector.test_record import hand_until_scheduled
from tests.orchestration import Parts, compact_now, conversation, user

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
    assert "compaction-worker rewind c --version 1" in text
    assert f'id="msg-{snapshot.meta.msg_count}"' in text  # the whole transcript is there
    for item in chunk.artifacts[:3]:
        assert item.partition(": ")[2] in text.replace("&#39;", "'").replace("&#34;", '"').replace(
            "&amp;", "&"
        )


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
