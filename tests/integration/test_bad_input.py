"""A corpus of bad input, end to end: every kind lands on the DLQ once, intact, and nothing else moves.

Each case is one distinct way a ``conversation.turn`` record can be unusable (not JSON, not
UTF-8, not an object, each schema rule broken, too big, wrongly keyed, an unknown model).
The same corpus runs twice: through the turn handler alone (fast, one test per case, for a
precise failure) and through the real broker and a running worker, interleaved with good
turns of other conversations and with what needs a stored history: a gap that never
fills, and a stored ``turn_seq`` reused by other content (a conflicting duplicate).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis.asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from compaction_worker.contracts.events import DeadLetter
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.turns import TurnOutcome, TurnStatus
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings
from compaction_worker.state.refusals import Rejection
from compaction_worker.testing import turn_bytes, turn_payload
from tests.orchestration import Parts, Published, all_keys, make_settings

pytestmark = pytest.mark.integration

MODEL = "gpt-4o-mini"
MAX_EVENT_BYTES = 512 * 1024  # room for 10,001 empty messages, the schema's limit plus one
GAP_TIMEOUT = 2.0
SECTIONS: dict[str, dict[str, Any]] = {
    "kafka": {"max_event_bytes": MAX_EVENT_BYTES},
    # Unknown models are refused, so that the corpus can hold one.
    "budget": {"fallback_window": None},
}


@dataclass(frozen=True)
class Case:
    """One bad record: its bytes, its Kafka key and the reason it must be dead-lettered with."""

    name: str
    payload: bytes
    key: bytes | None
    reason: str
    tombstone: bool = False
    """Sent as a null record value (Kafka's tombstone); the worker sees empty bytes."""


def event(cid: str, **changes: Any) -> dict[str, Any]:
    """A valid turn of ``cid`` (seq 1, one user message) as JSON, with fields changed or (``None``) removed."""
    data = turn_payload(cid, 1, [{"role": "user", "content": f"hello from {cid}"}], MODEL)
    for name, value in changes.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    return data


def dumps(data: Any) -> bytes:
    return json.dumps(data).encode()


def with_message(cid: str, message: dict[str, Any]) -> bytes:
    return dumps(event(cid, messages=[{"role": "user", "content": "question"}, message]))


def tool_call(**changes: Any) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read", "arguments": "{}"},
    }
    call.update(changes)
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


MALFORMED: list[tuple[str, Callable[[str], bytes]]] = [
    ("truncated object", lambda c: dumps(event(c))[:-10]),
    ("plain text", lambda c: f"turn one of {c}, not JSON".encode()),
    ("trailing comma", lambda c: dumps(event(c))[:-1] + b",}"),
    ("single quotes", lambda c: str(event(c)).encode()),
    ("unquoted keys", lambda c: f'{{conversation_id: "{c}", turn_seq: 1}}'.encode()),
    ("two documents in one record", lambda c: dumps(event(c)) + dumps(event(c, turn_seq=2))),
    ("empty payload", lambda c: b""),
    ("whitespace only", lambda c: b" \n\t "),
    ("NUL bytes", lambda c: b"\x00" * 8),
    ("invalid UTF-8 bytes", lambda c: b"\xff\xfe\xfa" + c.encode()),
    ("Latin-1 text inside a string", lambda c: dumps(event(c)).replace(b"hello", b"caf\xe9")),
    ("UTF-16 encoded", lambda c: json.dumps(event(c)).encode("utf-16")),
    ("UTF-32 encoded", lambda c: json.dumps(event(c)).encode("utf-32")),
    ("UTF-8 byte order mark", lambda c: b"\xef\xbb\xbf" + dumps(event(c))),
    (
        "NaN in a tool schema",
        lambda c: dumps(event(c))[:-1] + b', "tools": [{"type": "function", "x": NaN}]}',
    ),
    ("Infinity in usage", lambda c: dumps(event(c))[:-1] + b', "usage": {"prompt_tokens": Infinity}}'),
    ("lone surrogate escape", lambda c: dumps(event(c)).replace(b"hello", b"\\ud800hello")),
    ("raw control character in a string", lambda c: dumps(event(c)).replace(b"hello", b"hel\nlo")),
    ("nesting 300 deep", lambda c: dumps(event(c))[:-3] + f', "extra": {nested(300)}}}]}}'.encode()),
    ("nesting 20000 deep", lambda c: dumps(event(c))[:-1] + f', "tools": {nested(20000)}}}'.encode()),
]

SCHEMA: list[tuple[str, Callable[[str], bytes]]] = [
    ("JSON array", lambda c: dumps([event(c)])),
    ("JSON string", dumps),
    ("JSON number", lambda c: b"42"),
    ("JSON null", lambda c: b"null"),
    ("JSON true", lambda c: b"true"),
    ("empty object", lambda c: b"{}"),
    ("no conversation_id", lambda c: dumps(event(c, conversation_id=None, system_prompt=c))),
    ("no turn_seq", lambda c: dumps(event(c, turn_seq=None))),
    ("no model", lambda c: dumps(event(c, model=None))),
    ("no messages, system_prompt or compaction", lambda c: dumps(event(c, messages=None))),
    ("conversation_id a number", lambda c: dumps(event(c, conversation_id=7, system_prompt=c))),
    ("conversation_id empty", lambda c: dumps(event(c, conversation_id="", system_prompt=c))),
    ("conversation_id with a hash tag", lambda c: dumps(event(c, conversation_id=c + "{x}"))),
    ("conversation_id with a control character", lambda c: dumps(event(c, conversation_id=c + "\u0001"))),
    ("conversation_id over 256 characters", lambda c: dumps(event(c, conversation_id=c + "x" * 256))),
    ("turn_seq zero", lambda c: dumps(event(c, turn_seq=0))),
    ("turn_seq negative", lambda c: dumps(event(c, turn_seq=-3))),
    ("turn_seq a numeric string", lambda c: dumps(event(c, turn_seq="1"))),
    ("turn_seq fractional", lambda c: dumps(event(c, turn_seq=1.5))),
    ("turn_seq a boolean", lambda c: dumps(event(c, turn_seq=True))),
    ("turn_seq null", lambda c: dumps(event(c)).replace(b'"turn_seq": 1', b'"turn_seq": null')),
    ("model empty", lambda c: dumps(event(c, model=""))),
    ("model a number", lambda c: dumps(event(c, model=4))),
    ("messages an object", lambda c: dumps(event(c, messages={"role": "user", "content": "hi"}))),
    ("message a string", lambda c: dumps(event(c, messages=["hi"]))),
    ("unknown role", lambda c: with_message(c, {"role": "robot", "content": "beep"})),
    ("no role", lambda c: with_message(c, {"content": "who am I"})),
    ("tool result without tool_call_id", lambda c: with_message(c, {"role": "tool", "content": "42"})),
    (
        "tool_call_id on a user message",
        lambda c: with_message(c, {"role": "user", "content": "x", "tool_call_id": "t"}),
    ),
    (
        "tool_calls on a user message",
        lambda c: with_message(c, {**tool_call(), "role": "user", "content": "x"}),
    ),
    ("tool call without id", lambda c: with_message(c, tool_call(id=None))),
    ("tool call with empty id", lambda c: with_message(c, tool_call(id=""))),
    ("tool call function without name", lambda c: with_message(c, tool_call(function={"arguments": "{}"}))),
    (
        "tool call arguments an object",
        lambda c: with_message(c, tool_call(function={"name": "f", "arguments": {}})),
    ),
    ("tool call of an unknown type", lambda c: with_message(c, tool_call(type="web_search"))),
    ("tool_calls not a list", lambda c: with_message(c, {"role": "assistant", "tool_calls": {"id": "a"}})),
    ("assistant with neither content nor tool calls", lambda c: with_message(c, {"role": "assistant"})),
    ("user content null", lambda c: with_message(c, {"role": "user", "content": None})),
    ("content a number", lambda c: with_message(c, {"role": "user", "content": 12})),
    ("content part without type", lambda c: with_message(c, {"role": "user", "content": [{"text": "x"}]})),
    ("text part without text", lambda c: with_message(c, {"role": "user", "content": [{"type": "text"}]})),
    (
        "image part without image",
        lambda c: with_message(c, {"role": "user", "content": [{"type": "image_url"}]}),
    ),
    ("name a number", lambda c: with_message(c, {"role": "user", "content": "x", "name": 3})),
    ("pinned a string", lambda c: with_message(c, {"role": "user", "content": "x", "pinned": "yes"})),
    ("over 10000 messages", lambda c: dumps(event(c, messages=[{"role": "user", "content": ""}] * 10_001))),
    ("system_prompt a number", lambda c: dumps(event(c, system_prompt=5))),
    ("tools an object", lambda c: dumps(event(c, tools={"type": "function"}))),
    ("tools a list of strings", lambda c: dumps(event(c, tools=["read_file"]))),
    ("context_window zero", lambda c: dumps(event(c, context_window=0))),
    ("context_window negative", lambda c: dumps(event(c, context_window=-8192))),
    ("context_window below 256", lambda c: dumps(event(c, context_window=100))),
    ("context_window a string", lambda c: dumps(event(c, context_window="8192"))),
    ("max_output_tokens zero", lambda c: dumps(event(c, max_output_tokens=0))),
    ("usage prompt_tokens negative", lambda c: dumps(event(c, usage={"prompt_tokens": -5}))),
    ("usage prompt_tokens a word", lambda c: dumps(event(c, usage={"prompt_tokens": "many"}))),
    ("usage without prompt_tokens", lambda c: dumps(event(c, usage={"completion_tokens": 3}))),
    ("usage a number", lambda c: dumps(event(c, usage=100))),
    ("unknown compaction mode", lambda c: dumps(event(c, compaction={"mode": "compress"}))),
    ("overflow request without the error", lambda c: dumps(event(c, compaction={"mode": "overflow"}))),
    (
        "compaction request with an unknown field",
        lambda c: dumps(event(c, compaction={"mode": "force", "x": 1})),
    ),
    ("compaction a string", lambda c: dumps(event(c, compaction="force"))),
    (
        "provider error over 20000 characters",
        lambda c: dumps(event(c, compaction={"mode": "overflow", "error": "e" * 20_001})),
    ),
    ("schema_version 2", lambda c: dumps(event(c, schema_version=2))),
    ("event_id not a UUID", lambda c: dumps(event(c, event_id="event-1"))),
    ("timestamp without a timezone", lambda c: dumps(event(c, timestamp="2026-01-01T00:00:00"))),
    ("timestamp a number", lambda c: dumps(event(c, timestamp=1_767_225_600))),
    ("timestamp not a date", lambda c: dumps(event(c, timestamp="yesterday"))),
]

OTHER: list[tuple[str, str, Callable[[str], bytes], Callable[[str], bytes | None]]] = [
    (
        "over max_event_bytes",
        "oversized",
        lambda c: dumps(event(c, messages=[{"role": "user", "content": "x" * MAX_EVENT_BYTES}])),
        lambda c: c.encode(),
    ),
    (
        "far over max_event_bytes (its DLQ record would pass 1 MB)",
        "oversized",
        lambda c: dumps(event(c, messages=[{"role": "user", "content": "y" * 900_000}])),
        lambda c: c.encode(),
    ),
    ("keyed by another id", "key_mismatch", lambda c: dumps(event(c)), lambda c: b"someone-else"),
    (
        "keyed by the id in other case",
        "key_mismatch",
        lambda c: dumps(event(c)),
        lambda c: c.upper().encode(),
    ),
    ("keyed by the id plus a NUL", "key_mismatch", lambda c: dumps(event(c)), lambda c: c.encode() + b"\x00"),
    (
        "unknown model, no fallback window",
        "unknown_model",
        lambda c: dumps(event(c, model="acme/llm-9000")),
        lambda c: c.encode(),
    ),
]


def corpus() -> list[Case]:
    """Every case, each about its own conversation (``bad-<n>``), keyed by it unless the case is the key."""
    cases: list[Case] = []
    for reason, group in (("malformed_json", MALFORMED), ("schema_violation", SCHEMA)):
        for name, make in group:
            cid = f"bad-{len(cases)}"
            cases.append(Case(name, make(cid), cid.encode(), reason))
    for name, reason, make, key in OTHER:
        cid = f"bad-{len(cases)}"
        cases.append(Case(name, make(cid), key(cid), reason))
    cases.append(
        Case("null record value", b"", f"bad-{len(cases)}".encode(), "malformed_json", tombstone=True)
    )
    return cases


CORPUS = corpus()


def test_the_corpus_is_large_and_distinct() -> None:
    """At least 50 kinds of bad input, each with its own key (DLQ records are matched by their key)."""
    assert len(CORPUS) >= 50
    assert len({c.name for c in CORPUS}) == len(CORPUS)
    assert len({c.key for c in CORPUS}) == len(CORPUS)
    assert len({c.payload for c in CORPUS if not c.tombstone}) == len(CORPUS) - 1


def stored_ids(keys: list[bytes]) -> set[str]:
    """The conversation ids that own Redis keys (the part between the braces)."""
    return {k.decode(errors="replace").split("{", 1)[1].split("}", 1)[0] for k in keys if b"{" in k}


async def rejections(redis_client: redis.asyncio.Redis, keys: list[bytes]) -> set[tuple[str, str]]:
    """The (reason, detail) of every rejection recorded in the ``refused`` hashes ``keys``."""
    found = set()
    for key in keys:
        for raw in (await redis_client.hgetall(key)).values():
            rejection = Rejection.from_json(raw)
            found.add((rejection.reason, rejection.detail))
    return found


def letters_of(records: list[bytes]) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(r) for r in records]


def assert_lettered(case: Case, letter: DeadLetter) -> None:
    """The record carries the case's reason, its key and its original bytes (cut only where it must be)."""
    assert letter.reason.value == case.reason, (case.name, letter.detail)
    assert letter.original_size == len(case.payload), case.name
    original = base64.b64decode(letter.original_b64)
    if len(case.payload) < 600_000:
        assert original == case.payload, case.name
    else:  # too big to travel whole: the record says how much it kept
        assert case.payload.startswith(original), case.name
        assert len(original) > 500_000, case.name
        assert f"first {len(original)} of {len(case.payload)} bytes" in letter.detail
    assert letter.key_b64 is not None, case.name
    assert base64.b64decode(letter.key_b64) == case.key, case.name
    assert letter.detail, case.name


# --- the handler alone --------------------------------------------------------------------


@pytest.fixture
def settings() -> Settings:
    """The corpus's settings over the in-process ones (those of the ``parts`` fixture)."""
    return make_settings(**SECTIONS)


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
async def test_handler_dead_letters(
    case: Case, parts: Parts, published: Published, redis_client: redis.asyncio.Redis
) -> None:
    """Each case alone: one DLQ record with its reason and bytes, nothing stored, no exception; only
    the rejection, for an event that names a valid conversation id and a seq (state/refusals.py)."""
    outcome = await parts.turns.handle(case.payload, case.key, 0, 7)
    assert outcome.status is TurnStatus.DEAD_LETTERED
    (letter,) = letters_of([p for t, p, _ in published.events if t == parts.turns.settings.topics.dlq])
    assert_lettered(case, letter)
    assert (letter.partition, letter.offset) == (0, 7)
    keys = await all_keys(redis_client)
    if keys:
        assert letter.conversation_id is not None
        assert letter.turn_seq is not None
        refused = parts.store.keys(letter.conversation_id).refused
        assert keys == [refused.encode()], case.name
        assert await rejections(redis_client, [refused.encode()]) == {(letter.reason.value, letter.detail)}


# --- the real broker and a running worker -------------------------------------------------

GOOD = [f"good-{i}" for i in range(3)]
GOOD_TURNS = 6
GAP = "gap"
DUP = "dup"


def good_turn(cid: str, seq: int) -> bytes:
    role = "user" if seq % 2 else "assistant"
    return turn_bytes(cid, seq, [{"role": role, "content": f"{cid} turn {seq}"}], MODEL)


async def test_corpus_through_the_broker_and_a_running_worker(
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    make_topics: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every bad record is dead-lettered once and intact; the worker keeps going; no bad conversation is stored."""
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=2)
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        **SECTIONS,
        worker={"sweep_interval_seconds": 0.2, "gap_timeout_seconds": GAP_TIMEOUT},
    )
    await ensure_topics(settings)
    prefix = settings.redis.key_prefix
    gap_third = good_turn(GAP, 3)
    # Turn 1 of DUP, published again under a new event id (a duplicate), then reused by
    # other content (a conflicting duplicate).
    dup_first = good_turn(DUP, 1)
    dup_again = dumps({**json.loads(dup_first), "event_id": str(uuid.uuid4())})
    dup_conflict = dumps(event(DUP, messages=[{"role": "user", "content": "not turn 1"}]))
    expected = len(CORPUS) + 2  # and the turn held behind a gap that never fills, and the conflict
    deliveries = len(CORPUS) + len(GOOD) * GOOD_TURNS + 2 + 3
    outcomes: list[TurnOutcome] = []
    all_handled = asyncio.Event()

    def on_turn(outcome: TurnOutcome) -> None:
        outcomes.append(outcome)
        if len(outcomes) >= deliveries:
            all_handled.set()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=4 * 1024 * 1024)
    dlq = AIOKafkaConsumer(
        settings.topics.dlq,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"dlq-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        fetch_max_bytes=8 * 1024 * 1024,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    worker = build_worker(settings, on_turn=on_turn)
    caplog.set_level(logging.ERROR)
    await producer.start()
    await dlq.start()
    try:
        async with worker.running():

            async def send(payload: bytes, key: bytes | None) -> None:
                await producer.send_and_wait(settings.topics.turns, payload, key=key)

            async def send_case(case: Case) -> None:
                await producer.send_and_wait(
                    settings.topics.turns, None if case.tombstone else case.payload, key=case.key
                )

            # Good turns first, then the corpus, then the rest of the good turns and a gap.
            for seq in range(1, GOOD_TURNS // 2 + 1):
                for cid in GOOD:
                    await send(good_turn(cid, seq), cid.encode())
            await send(good_turn(GAP, 1), GAP.encode())
            await send(dup_first, DUP.encode())
            for case in CORPUS:
                await send_case(case)
            await send(gap_third, GAP.encode())
            await send(dup_again, DUP.encode())
            await send(dup_conflict, DUP.encode())
            for seq in range(GOOD_TURNS // 2 + 1, GOOD_TURNS + 1):
                for cid in GOOD:
                    await send(good_turn(cid, seq), cid.encode())

            records: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(records) < expected and time.monotonic() < deadline:
                for batch in (await dlq.getmany(timeout_ms=300)).values():
                    records.extend(r.value for r in batch)
            # A little longer: a second copy of any record would show up now.
            for batch in (await dlq.getmany(timeout_ms=1000)).values():
                records.extend(r.value for r in batch)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_handled.wait(), max(0.1, deadline - time.monotonic()))
            assert worker.handled == deliveries, repr(worker)

            letters = letters_of(records)
            assert len(letters) == expected, f"{len(letters)} records for {expected} bad inputs"
            for case in CORPUS:
                assert case.key is not None
                key_b64 = base64.b64encode(case.key).decode()
                found: list[DeadLetter | None] = [x for x in letters if x.key_b64 == key_b64]
                (letter,) = found or [None]
                assert letter is not None, f"no record for {case.name}"
                assert_lettered(case, letter)
            (gap_letter,) = [x for x in letters if x.reason.value == "sequence_gap"]
            assert base64.b64decode(gap_letter.original_b64) == gap_third
            assert (gap_letter.conversation_id, gap_letter.turn_seq) == (GAP, 3)
            assert gap_letter.detail.startswith(f"turn 3 of {GAP} waited ")
            assert gap_letter.detail.endswith(" for turn 2")
            (dup_letter,) = [x for x in letters if x.reason.value == "conflicting_duplicate"]
            assert base64.b64decode(dup_letter.original_b64) == dup_conflict
            assert (dup_letter.conversation_id, dup_letter.turn_seq) == (DUP, 1)
            assert base64.b64decode(dup_letter.key_b64 or "") == DUP.encode()
            assert f"turn_seq 1 of {DUP}" in dup_letter.detail
            # The stored turn is the first one, once.
            assert [r["m"]["content"] for r in await worker.store.transcript(DUP)] == [f"{DUP} turn 1"]

            # The good conversations are whole, including the turns sent after the corpus.
            for cid in GOOD:
                transcript = await worker.store.transcript(cid)
                assert [r["m"]["content"] for r in transcript] == [f"{cid} turn {s}" for s in range(1, 7)]
            # The gap's conversation kept its first turn and nothing else; nothing is held.
            assert [r["seq"] for r in await worker.store.transcript(GAP)] == [1]
            assert await worker.turns.gaps.held_turns(GAP) == []
            assert await worker.turns.gaps.held_count() == 0
            # No bad conversation owns a key; no global index names one.
            # The client does not decode; the indexes' buckets are ``{<prefix>:<index>:<n>}``.
            keys = cast("list[bytes]", await all_keys(redis_client, f"{prefix}:*"))
            # A bad conversation owns at most the rejections its runtime reads, each a dead letter's.
            refused = [k for k in keys if k.endswith(b":refused")]
            assert stored_ids([k for k in keys if k not in refused]) == {*GOOD, GAP, DUP}
            assert await rejections(redis_client, refused) <= {(x.reason.value, x.detail) for x in letters}
            buckets = cast("list[bytes]", await all_keys(redis_client, f"{{{prefix}:*"))
            for key in [*buckets, *keys]:
                if (key in buckets or b"{" not in key) and await redis_client.type(key) == b"zset":
                    zset = cast("list[bytes]", await redis_client.zrange(key, 0, -1))
                    members = {m.decode() for m in zset}
                    assert members <= {*GOOD, GAP, DUP}, key
            statuses = [o.status for o in outcomes]
            assert statuses.count(TurnStatus.DEAD_LETTERED) == len(CORPUS) + 1
            assert statuses.count(TurnStatus.BUFFERED) == 1
            assert statuses.count(TurnStatus.DUPLICATE) == 1
    finally:
        await dlq.stop()
        await producer.stop()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
