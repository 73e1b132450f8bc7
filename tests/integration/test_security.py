"""Security basics: secrets come from settings and never reach a log line or an event."""

from __future__ import annotations

import logging

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import Outcome
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import RedisSettings
from compaction_worker.testing import FakeLLMServer
from tests.orchestration import make_settings

from .helpers import compaction_events, read_topic, settle

pytestmark = pytest.mark.integration

API_KEY = "sk-live-4f9c2e7a1b8d3f6e0a5c9b2d7e4f1a8c"
SASL_PASSWORD = "kafka-pass-6d1e9b3c7a2f"
REDIS_PASSWORD = "redis-pass-0b7c4e9a2d5f"
SECRETS = (API_KEY, SASL_PASSWORD, REDIS_PASSWORD)


async def test_no_secret_is_logged_or_published(
    kafka_bootstrap: str,
    redis_url: str,
    make_topics: object,
    fake_llm: FakeLLMServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A whole run at DEBUG (LiteLLM's request logging included): no secret in any log record or event.

    The summarizer's API key is really used (the LLM summarizes); the SASL and Redis
    passwords are configured but not sent (this broker and Redis run without auth), and
    must not leak through the settings' own representations either.
    """
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=1)  # type: ignore[operator]
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer={"model": "openai/fake-summarizer", "api_base": fake_llm.url, "api_key": API_KEY},
        kafka={"sasl_username": "worker", "sasl_password": SASL_PASSWORD},
    )
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert not any(secret in text for secret in SECRETS)
    redis_settings = RedisSettings.model_validate({"url": redis_url, "password": REDIS_PASSWORD})
    assert redis_settings.password is not None
    assert REDIS_PASSWORD not in repr(redis_settings) + redis_settings.model_dump_json()

    caplog.set_level(logging.DEBUG)
    logging.getLogger("LiteLLM").setLevel(logging.DEBUG)
    await ensure_topics(settings)
    turns = synthetic_turns("sec", 40, context_window=3000, seed=3)
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:
        for event in turns:
            await client.publish_raw(event.model_dump_json(exclude_none=True).encode(), b"sec")
        await settle([worker], len(turns))
        _, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )
    assert any(
        c.outcome is Outcome.COMPACTED and c.summarizer_model == "openai/fake-summarizer"
        for c in completed["sec"]
    ), "the LLM (and so the API key) was never used"
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    assert len(caplog.records) > 50  # DEBUG really captured the run
    leaked = [secret for secret in SECRETS if secret in logged]
    assert leaked == []
    events = b"".join(
        [
            *await read_topic(settings, settings.topics.started),
            *await read_topic(settings, settings.topics.completed),
        ]
    )
    assert not any(secret.encode() in events for secret in SECRETS)
