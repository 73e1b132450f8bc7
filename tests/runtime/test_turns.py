"""The per-turn path against real Redis: append, duplicates, gaps, budget checks, dead letters."""

from __future__ import annotations

import base64
import json
import logging
import sys
import uuid
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.connection
import redis.exceptions

from compaction_worker.contracts.events import (
    DeadLetter,
    Trigger,
    TurnEvent,
)
from compaction_worker.conversation import decide as plan
from compaction_worker.conversation.meta import Meta
from compaction_worker.errors import ConcurrentUpdateError
from compaction_worker.observability.logs import ContextFilter
from compaction_worker.runtime import turns as turns_module
from compaction_worker.runtime.turns import TurnStatus
from compaction_worker.settings import Settings
from compaction_worker.state.connection import is_cluster
from compaction_worker.state.refusals import Rejection
from compaction_worker.state.store import Store
from compaction_worker.testing import turn_bytes, turn_event
from tests.orchestration import Parts, Published, all_keys, assistant, make_parts, user
from tests.state.helpers import hold

pytestmark = pytest.mark.integration

BAD_INPUTS = [
    (b"{not json", "malformed_json"),
    (b"\xff\xfe", "malformed_json"),
    (b"[1, 2]", "schema_violation"),
    (
        json.dumps({"conversation_id": "c", "turn_seq": 0, "model": "gpt-4o", "messages": []}).encode(),
        "schema_violation",
    ),
    (
        json.dumps(
            {
                "conversation_id": "c",
                "turn_seq": 1,
                "model": "gpt-4o",
                "messages": [{"role": "tool", "content": "x"}],
            }
        ).encode(),
        "schema_violation",
    ),
    (b"x" * 20000, "oversized"),
]


class TestTurns:
    @pytest.mark.parametrize(("payload", "reason"), BAD_INPUTS)
    async def test_bad_input_is_dead_lettered_with_original_bytes(
        self,
        parts: Parts,
        published: Published,
        redis_client: redis.asyncio.Redis,
        payload: bytes,
        reason: str,
    ) -> None:
        """Bad input becomes a DLQ record with its reason and original bytes; nothing is stored but, for
        an event that names its conversation and seq, the rejection the runtime reads (state/refusals.py)."""
        outcome = await parts.turns.handle(payload, b"c", 3, 42)
        assert outcome.status is TurnStatus.DEAD_LETTERED
        (record,) = published.on("conversation.turn.dlq")
        letter = DeadLetter.model_validate(record)
        assert (letter.reason.value, letter.partition, letter.offset) == (reason, 3, 42)
        assert base64.b64decode(letter.original_b64) == payload
        refused = parts.store.keys("c").refused
        assert await all_keys(redis_client) == ([refused.encode()] if letter.turn_seq is not None else [])
        if letter.turn_seq is not None:
            raw = await redis_client.hget(refused, str(letter.turn_seq))
            assert raw is not None
            stored = Rejection.from_json(raw)
            assert (stored.reason, stored.detail) == (reason, letter.detail)

    async def test_key_must_be_the_conversation_id(self, parts: Parts, published: Published) -> None:
        """An event keyed by something else would lose its ordering; it is dead-lettered."""
        outcome = await parts.turns.handle(turn_bytes("c", 1, [user("hi")]), b"other")
        assert outcome.reason == "key_mismatch"

    async def test_duplicate_changes_nothing(self, parts: Parts) -> None:
        """A redelivered turn is recognised and stores nothing (docs/design.md, invariant 2)."""
        assert (
            await parts.turns.handle(turn_bytes("c", 1, [user("hi")]), b"c")
        ).status is TurnStatus.APPENDED
        before = await parts.store.meta("c")
        assert (
            await parts.turns.handle(turn_bytes("c", 1, [user("hi")]), b"c")
        ).status is TurnStatus.DUPLICATE
        assert await parts.store.meta("c") == before

    async def test_republished_under_a_new_event_id_is_a_duplicate(
        self, parts: Parts, published: Published
    ) -> None:
        """A runtime publishing a turn again (new event_id and timestamp, same content) sends nothing to the DLQ."""
        first = turn_bytes("c", 1, [user("hi")], system_prompt="be brief", event_id=str(uuid.uuid4()))
        again = turn_bytes("c", 1, [user("hi")], system_prompt="be brief", event_id=str(uuid.uuid4()))
        assert first != again
        await parts.turns.handle(first, b"c")
        assert (await parts.turns.handle(again, b"c")).status is TurnStatus.DUPLICATE
        assert published.on("conversation.turn.dlq") == []

    @pytest.mark.parametrize(
        "changes",
        [
            {"messages": [user("bye")]},
            {"model": "gpt-4o-mini-2024-07-18"},
            {"system_prompt": "be verbose"},
            {"tools": [{"type": "function", "function": {"name": "search"}}]},
            {"context_window": 4096},
            {"compaction": {"mode": "force"}},
        ],
        ids=["messages", "model", "system_prompt", "tools", "context_window", "compaction"],
    )
    async def test_conflicting_duplicate_is_dead_lettered_and_the_stored_turn_kept(
        self, parts: Parts, published: Published, redis_client: redis.asyncio.Redis, changes: dict[str, Any]
    ) -> None:
        """A stored seq reused with other content goes to the DLQ (conflicting_duplicate, naming the seq); nothing stored moves."""
        await parts.turns.handle(turn_bytes("c", 1, [user("hi")], system_prompt="be brief"), b"c")
        await parts.turns.handle(turn_bytes("c", 2, [assistant("hello")]), b"c")
        before = {k: await redis_client.dump(k) for k in sorted(await all_keys(redis_client))}
        fields: dict[str, Any] = {"system_prompt": "be brief", "messages": [user("hi")], **changes}
        payload = turn_bytes("c", 1, list(fields.pop("messages")), **fields)

        outcome = await parts.turns.handle(payload, b"c", 0, 9)

        assert (outcome.status, outcome.reason) == (TurnStatus.DEAD_LETTERED, "conflicting_duplicate")
        (record,) = published.on("conversation.turn.dlq")
        letter = DeadLetter.model_validate(record)
        assert (letter.reason.value, letter.conversation_id, letter.turn_seq) == (
            "conflicting_duplicate",
            "c",
            1,
        )
        assert (letter.partition, letter.offset) == (0, 9)
        assert base64.b64decode(letter.original_b64) == payload
        assert "turn_seq 1 of c" in letter.detail
        refused = parts.store.keys("c").refused
        after = {k: await redis_client.dump(k) for k in sorted(await all_keys(redis_client))}
        assert {k: v for k, v in after.items() if k != refused.encode()} == before
        assert [r["m"]["content"] for r in await parts.store.transcript("c")] == ["hi", "hello"]
        # The runtime reads the rejection by seq, with the refused event's id.
        raw = await redis_client.hget(refused, "1")
        assert raw is not None
        stored = Rejection.from_json(raw)
        assert (stored.reason, stored.detail, stored.event_id) == (
            "conflicting_duplicate",
            letter.detail,
            json.loads(payload)["event_id"],
        )

    async def test_a_stored_turn_whose_fingerprint_is_gone_takes_a_redelivery_as_a_duplicate(
        self, parts: Parts, published: Published
    ) -> None:
        """With nothing to compare (its fingerprints' hash deleted by hand), a redelivery is a duplicate, not a conflict."""
        await parts.turns.handle(turn_bytes("c", 1, [user("hi")]), b"c")
        await parts.store.redis.delete(parts.store.keys("c").fingerprints)
        assert (
            await parts.turns.handle(turn_bytes("c", 1, [user("bye")]), b"c")
        ).status is TurnStatus.DUPLICATE
        assert published.on("conversation.turn.dlq") == []
        assert (
            await parts.turns.handle(turn_bytes("c", 2, [assistant("ok")]), b"c")
        ).status is TurnStatus.APPENDED

    async def test_gap_is_held_until_filled_then_applied_in_order(self, parts: Parts) -> None:
        """Turns ahead of a gap wait; the missing turn releases them in order."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        assert (
            await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        ).status is TurnStatus.BUFFERED
        assert (
            await parts.turns.handle(turn_bytes("c", 4, [assistant("four")]), b"c")
        ).status is TurnStatus.BUFFERED
        assert (await parts.store.meta("c")).last_seq == 1
        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        assert [r["m"]["content"] for r in await parts.store.transcript("c")] == [
            "one",
            "two",
            "three",
            "four",
        ]
        assert await parts.gaps.held_turns("c") == []

    async def test_a_conflicting_turn_while_the_original_is_held_is_dead_lettered(
        self, parts: Parts, published: Published
    ) -> None:
        """Turn 3 held behind a gap, then another turn 3: that one goes to the DLQ; the held one applies later."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        assert (
            await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        ).status is TurnStatus.BUFFERED
        other = turn_bytes("c", 3, [user("not three")])

        outcome = await parts.turns.handle(other, b"c")

        assert (outcome.status, outcome.reason) == (TurnStatus.DEAD_LETTERED, "conflicting_duplicate")
        (letter,) = [DeadLetter.model_validate(r) for r in published.on("conversation.turn.dlq")]
        assert (letter.turn_seq, base64.b64decode(letter.original_b64)) == (3, other)
        assert "held behind a gap" in letter.detail
        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        assert [r["m"]["content"] for r in await parts.store.transcript("c")] == ["one", "two", "three"]

    async def test_a_released_held_turn_redelivered_with_other_content_is_dead_lettered(
        self, parts: Parts, published: Published
    ) -> None:
        """A turn applied from behind a gap has its fingerprint stored like any other."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        assert (
            await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        ).status is TurnStatus.DUPLICATE
        outcome = await parts.turns.handle(turn_bytes("c", 3, [user("three, again")]), b"c")
        assert outcome.reason == "conflicting_duplicate"
        assert [r["m"]["content"] for r in await parts.store.transcript("c")] == ["one", "two", "three"]

    async def test_a_turn_meeting_a_different_held_copy_of_its_seq_is_refused(
        self, parts: Parts, published: Published
    ) -> None:
        """A rebalance overlap: another worker held turn 2 before turn 1 was seen; a different turn 2 does not replace it."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        held = turn_bytes("c", 2, [assistant("two")])
        held_fp = TurnEvent.model_validate_json(held).fingerprint()
        await hold(parts.turns.gaps, "c", 2, held, fingerprint=held_fp)

        outcome = await parts.turns.handle(turn_bytes("c", 2, [assistant("other two")]), b"c")

        assert outcome.reason == "conflicting_duplicate"
        assert [r["m"]["content"] for r in await parts.store.transcript("c")] == ["one", "two"]
        assert await parts.store.fingerprint("c", 2) == held_fp
        assert await parts.gaps.held_turns("c") == []

    async def test_threshold_schedules_a_job(self, parts: Parts) -> None:
        """References 000-004 (the automatic trigger): crossing the hard threshold records a threshold job."""
        outcome = await parts.turns.handle(
            turn_bytes("c", 1, [user("word " * 900)], context_window=1024), b"c"
        )
        assert outcome.scheduled is Trigger.THRESHOLD
        job = await parts.jobs.job("c")
        assert job is not None
        assert job.trigger is Trigger.THRESHOLD
        assert await parts.jobs.due(5) == ["c"]

    async def test_soft_threshold(self, parts: Parts, settings: Settings) -> None:
        """DESIGN "Budget", instead of references 000 (waiting) and 004 (warnings): between the soft and hard thresholds a background (soft) job is recorded."""
        settings.budget.soft_trigger_fraction = 0.3
        outcome = await parts.turns.handle(
            turn_bytes("c", 1, [user("word " * 700)], context_window=2048), b"c"
        )
        assert outcome.scheduled is Trigger.SOFT_THRESHOLD

    async def test_manual_and_reactive_requests(self, parts: Parts) -> None:
        """References 000 and 002 (manual /compact, reactive compaction): a turn's compaction request is recorded with the turn, reactive with its error."""
        await parts.turns.handle(turn_bytes("c", 1, [user("hi")], compaction={"mode": "force"}), b"c")
        job = await parts.jobs.job("c")
        assert job is not None
        assert job.trigger is Trigger.MANUAL
        err = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
        await parts.turns.handle(turn_bytes("c", 2, [], compaction={"mode": "overflow", "error": err}), b"c")
        job = await parts.jobs.job("c")
        assert job is not None
        assert (job.trigger, job.error) == (Trigger.REACTIVE, err)

    async def test_automatic_compaction_can_be_switched_off(self, parts: Parts, settings: Settings) -> None:
        """Reference 004 (``enabled``, the master switch): off, a crossed threshold schedules nothing; a manual request still does."""
        settings.budget.auto_compact = False
        outcome = await parts.turns.handle(
            turn_bytes("c", 1, [user("word " * 900)], context_window=1024), b"c"
        )
        assert outcome.scheduled is None
        assert await parts.jobs.job("c") is None
        await parts.turns.handle(
            turn_bytes("c", 2, [assistant("ok")], compaction={"mode": "force"}, context_window=1024), b"c"
        )
        job = await parts.jobs.job("c")
        assert job is not None
        assert job.trigger is Trigger.MANUAL

    async def test_the_request_framing_counts_once(self, parts: Parts, settings: Settings) -> None:
        """Reference 004 (TOKENS_PER_CONVERSATION, 24): a conversation-level overhead is part of the fixed tokens."""
        await parts.turns.handle(turn_bytes("c", 1, [user("hi")]), b"c")
        meta = await parts.store.meta("c")
        assert meta.overhead_tokens == settings.budget.conversation_overhead_tokens == 24
        assert meta.total_tokens == meta.history_tokens + meta.system_tokens + meta.tools_tokens + 24

    async def test_a_stated_maximum_below_the_window_becomes_the_window(self, parts: Parts) -> None:
        """Reference 004 (reactive): the provider's stated maximum caps the window for every later budget check."""
        await parts.turns.handle(turn_bytes("c", 1, [user("hi")], context_window=128_000), b"c")
        before = await parts.store.meta("c")
        assert (before.window, before.observed_window) == (128_000, None)
        err = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
        await parts.turns.handle(
            turn_bytes("c", 2, [], compaction={"mode": "overflow", "error": err}, context_window=128_000),
            b"c",
        )
        after = await parts.store.meta("c")
        assert (after.window, after.observed_window) == (8192, 8192)
        assert after.threshold < before.threshold
        # Later turns, even ones that still claim the larger window, keep the provider's word.
        await parts.turns.handle(turn_bytes("c", 3, [assistant("ok")], context_window=128_000), b"c")
        assert (await parts.store.meta("c")).window == 8192
        # A larger stated maximum does not raise it again; an error without numbers changes nothing.
        big = err.replace("8192", "16384")
        await parts.turns.handle(turn_bytes("c", 4, [], compaction={"mode": "overflow", "error": big}), b"c")
        await parts.turns.handle(
            turn_bytes("c", 5, [], compaction={"mode": "overflow", "error": "prompt is too long"}), b"c"
        )
        assert (await parts.store.meta("c")).window == 8192

    async def test_calibration_follows_reported_usage(self, parts: Parts) -> None:
        """Reference 003 (estimates close to the provider's count): provider-reported prompt tokens move the calibration factor."""
        await parts.turns.handle(turn_bytes("c", 1, [user("hello " * 100)]), b"c")
        estimate = (await parts.store.meta("c")).total_tokens
        await parts.turns.handle(
            turn_bytes("c", 2, [assistant("ok")], usage={"prompt_tokens": estimate * 2}), b"c"
        )
        assert (await parts.store.meta("c")).calibration > 1.2

    async def test_system_prompt_and_tool_schemas_count_toward_the_threshold(self, parts: Parts) -> None:
        """References 000 (context meter), 001 and 004 (budget checker): the system prompt and tool schemas count toward the threshold."""
        message = user("word " * 300)  # well under the 768-token threshold of a 1,024-token window
        schema = {"type": "function", "function": {"name": "search", "description": "word " * 600}}
        alone = await parts.turns.handle(turn_bytes("alone", 1, [message], context_window=1024), b"alone")
        tools = await parts.turns.handle(
            turn_bytes("tools", 1, [message], tools=[schema], context_window=1024), b"tools"
        )
        prompt = await parts.turns.handle(
            turn_bytes("prompt", 1, [message], system_prompt="rule " * 600, context_window=1024), b"prompt"
        )
        assert alone.scheduled is None
        assert tools.scheduled is prompt.scheduled is Trigger.THRESHOLD
        meta = await parts.store.meta("tools")
        assert meta.total_tokens == meta.history_tokens + meta.tools_tokens + meta.overhead_tokens
        assert meta.history_tokens < meta.threshold < meta.total_tokens


class TestUnknownModelWarning:
    async def test_once_per_conversation_and_model_change(
        self, parts: Parts, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Issue 9: a model resolved to the fallback window is named at WARNING on each conversation's first turn and when its model changes, not on every turn."""
        model, other = f"acme/unknown-{uuid.uuid4().hex}", f"acme/unknown-{uuid.uuid4().hex}"
        with caplog.at_level(logging.WARNING, logger="compaction_worker.runtime.turns"):
            for seq in range(1, 4):
                await parts.turns.handle(turn_bytes("a", seq, [user(f"a{seq}")], model=model), b"a")
                await parts.turns.handle(turn_bytes("b", seq, [user(f"b{seq}")], model=model), b"b")
            await parts.turns.handle(turn_bytes("a", 4, [user("a4")], model=other), b"a")
            await parts.turns.handle(turn_bytes("a", 5, [user("a5")], model=other), b"a")
            await parts.turns.handle(turn_bytes("c", 1, [user("c1")], model="gpt-4o"), b"c")
            await parts.turns.handle(turn_bytes("d", 1, [user("d1")], model=model, context_window=8192), b"d")

        warned = [
            (r.getMessage().split(":", 1)[0], model in r.getMessage(), other in r.getMessage())
            for r in caplog.records
            if "no known context window" in r.getMessage()
        ]
        assert warned == [("a", True, False), ("b", True, False), ("a", False, True)]
        assert all(r.levelno == logging.WARNING for r in caplog.records if "context window" in r.getMessage())


class TestFingerprint:
    def test_identity_and_defaults_do_not_count(self) -> None:
        """The event id, timestamp and fields written at their defaults leave the fingerprint as it is."""
        base = TurnEvent.model_validate(
            {"conversation_id": "c", "turn_seq": 1, "model": "m", "messages": [user("x")]}
        )
        same = TurnEvent.model_validate(
            {
                "conversation_id": "c",
                "turn_seq": 1,
                "model": "m",
                "messages": [{"role": "user", "content": "x", "pinned": False}],
                "event_id": str(uuid.uuid4()),
                "timestamp": "2020-01-01T00:00:00Z",
                "schema_version": 1,
            }
        )
        assert base.fingerprint() == same.fingerprint()
        assert len(base.fingerprint()) == 32

    @pytest.mark.parametrize(
        "change",
        [
            {"messages": [user("y")]},
            {"messages": [{"role": "user", "content": "x", "pinned": True}]},
            {"messages": [user("x"), assistant("z")]},
            {"model": "m2"},
            {"system_prompt": "s"},
            {"tools": []},
            {"context_window": 1024},
            {"max_output_tokens": 100},
            {"usage": {"prompt_tokens": 5}},
            {"compaction": {"mode": "overflow", "error": "too long"}},
        ],
    )
    def test_any_content_change_counts(self, change: dict[str, Any]) -> None:
        """Messages, model, prompt, tools, overrides, usage and the compaction request each change it."""
        fields: dict[str, Any] = {
            "conversation_id": "c",
            "turn_seq": 1,
            "model": "m",
            "messages": [user("x")],
        }
        base = TurnEvent.model_validate(fields)
        assert TurnEvent.model_validate({**fields, **change}).fingerprint() != base.fingerprint()


class RoundTrips:
    """Counts the requests the connections of one client name write to Redis (a pipeline is one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.count = 0
        send = redis.asyncio.connection.Connection.send_packed_command

        async def counting(connection: Any, command: Any, check_health: bool = True) -> None:
            if connection.client_name == name:
                self.count += 1
            await send(connection, command, check_health)

        monkeypatch.setattr(redis.asyncio.connection.Connection, "send_packed_command", counting)


class TestOneRoundTrip:
    async def test_a_stored_turn_costs_one_script_call(
        self,
        redis_url: str,
        redis_client: redis.asyncio.Redis,
        settings: Settings,
        published: Published,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Deciding and storing a turn is one command on the wire; a handler that never saw the
        conversation pays one more, once (the meta it computes from). A lone call goes to the
        script, and so do calls that travel together (scripts.Pipeline)."""
        if is_cluster(redis_client):
            pytest.skip("counted on one server's connections (the cluster pass runs the same script)")
        name = f"turns-{uuid.uuid4().hex[:6]}"
        handler_client = redis.asyncio.Redis.from_url(redis_url, client_name=name)
        trips = RoundTrips(monkeypatch, name)
        try:
            handler = make_parts(handler_client, settings, published).turns
            await handler.handle(turn_bytes("warm", 1, [user("w")]), b"warm")  # loads the script
            before = trips.count
            for seq in range(1, 11):
                message = user(f"q{seq}") if seq % 2 else assistant(f"a{seq}")
                outcome = await handler.handle(turn_bytes("c", seq, [message]), b"c")
                assert outcome.status is TurnStatus.APPENDED
            assert trips.count - before == 10
            # Another handler (a rebalance moved the partition): its first turn reads the meta.
            other = make_parts(handler_client, settings, published).turns
            before = trips.count
            for seq in range(11, 14):
                await other.handle(turn_bytes("c", seq, [user(f"q{seq}")]), b"c")
            assert trips.count - before == 3 + 1
        finally:
            await handler_client.aclose()
        meta = await Store(redis_client, settings.redis.key_prefix, None).meta("c")
        assert (meta.last_seq, meta.msg_count) == (13, 13)

    async def test_a_meta_changed_by_another_writer_is_read_again(
        self, parts: Parts, redis_client: redis.asyncio.Redis
    ) -> None:
        """A compaction's commit (or a no-op's mark) bumps the revision: the next turn computes from the stored meta."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.store.set_meta("c", noop_tokens=12345)
        outcome = await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        assert outcome.status is TurnStatus.APPENDED
        meta = await parts.store.meta("c")
        assert (meta.last_seq, meta.msg_count, meta.noop_tokens) == (2, 2, 12345)

    async def test_a_turn_planned_again_on_the_stored_meta_is_counted_once(
        self, parts: Parts, published: Published, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A handler that knows no meta (a restart) plans the turn twice, the second time on the meta
        the script answered; its messages are counted once, and the stored totals are the exact ones."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        real, counts = plan.counted, 0

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal counts
            counts += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(plan, "counted", counted)
        fresh = make_parts(parts.store.redis, parts.settings, published).turns
        outcome = await fresh.handle(turn_bytes("c", 2, [assistant("two"), user("three")]), b"c")
        assert outcome.status is TurnStatus.APPENDED
        assert counts == 1
        meta = await parts.store.meta("c")
        expected = sum(m.tokens for m in real(turn_event("c", 1, [user("one")]), parts.settings.budget)[1])
        expected += sum(
            m.tokens
            for m in real(turn_event("c", 2, [assistant("two"), user("three")]), parts.settings.budget)[1]
        )
        assert (meta.last_seq, meta.msg_count, meta.history_tokens) == (2, 3, expected)

    async def test_a_meta_changed_before_every_call_is_an_outage_after_stale_tries_calls(
        self, parts: Parts, published: Published, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Another writer bumps the revision before each of the turn's calls: each is answered
        ``stale`` and writes nothing; after STALE_TRIES calls the turn is left unacknowledged
        (ConcurrentUpdateError is an outage: redelivered, never dead-lettered), stored turns untouched."""
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        real, calls = parts.appends.apply, 0

        async def raced(cid: str, writes: Any) -> Any:
            nonlocal calls
            calls += 1
            await parts.store.set_meta(cid, noop_tokens=calls)
            return await real(cid, writes)

        monkeypatch.setattr(parts.appends, "apply", raced)
        with pytest.raises(ConcurrentUpdateError, match="every one of 3 tries of turn 2"):
            await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        assert calls == turns_module.STALE_TRIES
        assert published.on("conversation.turn.dlq") == []
        meta = await parts.store.meta("c")
        assert (meta.last_seq, meta.msg_count, meta.noop_tokens) == (1, 1, 3)
        monkeypatch.setattr(
            parts.appends, "apply", real
        )  # the other writer is done: the redelivery is stored
        outcome = await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        assert outcome.status is TurnStatus.APPENDED


class TestPoisonTurns:
    async def test_a_turn_that_keeps_failing_is_dead_lettered_and_the_next_goes_on(
        self, parts: Parts, published: Published, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bug triggered by one turn: tried ``retry.turn_attempts`` times, then dead-lettered as
        processing_failed with the error; the handler returns, so the partition moves on."""
        monkeypatch.setattr(
            parts.turns, "policy", replace(parts.turns.policy, base_seconds=0.01, cap_seconds=0.01)
        )
        tries = 0
        real = plan.plan_append

        def broken(event: TurnEvent, *args: Any, **kwargs: Any) -> Any:
            nonlocal tries
            if event.conversation_id == "poison":
                tries += 1
                raise KeyError("a bug this turn triggers")
            return real(event, *args, **kwargs)

        monkeypatch.setattr(plan, "plan_append", broken)
        payload = turn_bytes("poison", 1, [user("x")])
        outcome = await parts.turns.handle(payload, b"poison", 2, 9)
        assert (outcome.status, outcome.reason) == (TurnStatus.DEAD_LETTERED, "processing_failed")
        assert tries == parts.turns.policy.attempts
        (letter,) = [DeadLetter.model_validate_json(p) for t, p, _ in published.events if t.endswith("dlq")]
        assert letter.reason.value == "processing_failed"
        assert "KeyError" in letter.detail
        assert "a bug this turn triggers" in letter.detail
        assert (letter.conversation_id, letter.partition, letter.offset) == ("poison", 2, 9)
        assert base64.b64decode(letter.original_b64) == payload
        assert (
            await parts.turns.handle(turn_bytes("fine", 1, [user("y")]), b"fine")
        ).status is TurnStatus.APPENDED

    async def test_a_held_turn_that_keeps_failing_is_dead_lettered_when_its_gap_fills(
        self, parts: Parts, published: Published, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The turn that fills the gap is stored; the held one behind it that fails every try
        goes to the DLQ and leaves the hash, so it cannot block its conversation."""
        monkeypatch.setattr(
            parts.turns, "policy", replace(parts.turns.policy, base_seconds=0.01, cap_seconds=0.01)
        )
        real = plan.plan_append

        def broken(event: TurnEvent, meta: Meta, *args: Any, **kwargs: Any) -> Any:
            if event.turn_seq == 3 and meta.last_seq == 2:  # applied after its gap filled
                raise RuntimeError("a bug the held turn triggers")
            return real(event, meta, *args, **kwargs)

        monkeypatch.setattr(plan, "plan_append", broken)
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        assert (
            await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")
        ).status is TurnStatus.BUFFERED
        outcome = await parts.turns.handle(turn_bytes("c", 2, [assistant("two")]), b"c")
        assert outcome.status is TurnStatus.APPENDED
        (letter,) = [DeadLetter.model_validate_json(p) for t, p, _ in published.events if t.endswith("dlq")]
        assert (letter.reason.value, letter.turn_seq) == ("processing_failed", 3)
        assert await parts.gaps.held_turns("c") == []
        assert (await parts.store.meta("c")).last_seq == 2

    async def test_a_failure_that_passes_is_retried_not_dead_lettered(
        self, parts: Parts, published: Published, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(
            parts.turns, "policy", replace(parts.turns.policy, base_seconds=0.01, cap_seconds=0.01)
        )
        real = plan.plan_append
        failures = iter([RuntimeError("once")])

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if (error := next(failures, None)) is not None:
                raise error
            return real(*args, **kwargs)

        monkeypatch.setattr(plan, "plan_append", flaky)
        outcome = await parts.turns.handle(turn_bytes("c", 1, [user("x")]), b"c")
        assert outcome.status is TurnStatus.APPENDED
        assert not [t for t, _, _ in published.events if t.endswith("dlq")]

    async def test_an_outage_is_not_retried_here_but_raised_for_redelivery(
        self, parts: Parts, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Redis away: the consumer rewinds and redelivers, without limit; the handler does not dead-letter it."""

        async def down(*_args: Any, **_kwargs: Any) -> Any:
            raise redis.exceptions.ConnectionError("Redis is down")

        monkeypatch.setattr(parts.appends, "apply", down)
        with pytest.raises(redis.exceptions.ConnectionError):
            await parts.turns.handle(turn_bytes("c", 1, [user("x")]), b"c")


async def test_every_line_logged_for_a_turn_names_its_conversation_and_seq(
    parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    """Bound once where the turn starts (observability/logs.py), not passed at each call."""
    caplog.handler.addFilter(ContextFilter())
    with caplog.at_level(logging.INFO, logger="compaction_worker"):
        await parts.turns.handle(turn_bytes("c", 1, [user("one")]), b"c")
        await parts.turns.handle(turn_bytes("c", 3, [user("three")]), b"c")  # held: logged
        await parts.turns.handle(b"{not json", b"k")  # a bad event: named by its key
    (held,) = [r for r in caplog.records if "waits for turn" in r.getMessage()]
    assert (getattr(held, "conversation_id", None), getattr(held, "turn_seq", None)) == ("c", 3)
    (bad,) = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert (getattr(bad, "conversation_id", None), getattr(bad, "turn_seq", None)) == ("k", None)


PER_TURN_MODULES = {
    "runtime/turns.py",  # parse, act
    "contracts/events.py",  # the event's model
    "conversation/decide.py",
    "conversation/meta.py",
    "budget/tokens.py",
    "budget/windows.py",
    "budget/threshold.py",
    "conversation/apply.py",
    "state/scripts.py",  # the script call
    "runtime/connections.py",  # the connection's command packer (hiredis; not on a cluster's)
    "observability/logs.py",
    "observability/tracing.py",
    "observability/metrics.py",
}
"""The modules a plain turn of a known conversation walks from the handler to its write: 10 of the
turn's logic and its write, 3 of its telemetry. A module that joins the path is a choice made here."""


async def test_a_known_conversations_turn_walks_only_the_per_turn_modules(parts: Parts) -> None:
    """The per-turn path stays readable and cheap: parse, decide, apply, act, and nothing else (every
    Python call whose code is the package's, recorded by the profiler; settings are read once, a
    retry loop is entered only on a failure, a conversation's keys are built once while it is served)."""
    await parts.turns.handle(turn_bytes("walk", 1, [user("hi")]), b"walk")
    seen: dict[str, set[str]] = {}
    root = "/compaction_worker/"

    def profile(frame: Any, event: str, _arg: object) -> None:
        path = frame.f_code.co_filename
        if event == "call" and root in path:
            seen.setdefault(path.split(root, 1)[1], set()).add(frame.f_code.co_name)

    raw = turn_bytes("walk", 2, [assistant("hello")])
    sys.setprofile(profile)
    try:
        outcome = await parts.turns.handle(raw, b"walk")
    finally:
        sys.setprofile(None)
    assert outcome.status is TurnStatus.APPENDED
    assert {"runtime/turns.py", "conversation/decide.py", "conversation/apply.py"} <= set(seen)
    assert set(seen) <= PER_TURN_MODULES, "\n".join(f"{m}: {sorted(c)}" for m, c in sorted(seen.items()))
