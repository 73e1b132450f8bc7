"""Errors that name what happened (issue 56): one type per condition, under the package's root error,
each message naming the conversation and what to do; through the Client, over a real Redis."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaProducer

from compaction_worker.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, Trigger
from compaction_worker.errors import (
    CompactionWorkerError,
    ConversationNotFound,
    InvalidProposalId,
    NoSuchMessage,
    NoSuchVersion,
    NothingToRewind,
    NotPinned,
    PinError,
    ProposalError,
    ProposalNotPending,
    RewindError,
    TurnRejected,
)
from compaction_worker.runtime.pool import run_job
from compaction_worker.settings import Settings
from compaction_worker.testing import turn_bytes, turn_event
from tests.orchestration import Parts, Published, assistant, user

pytestmark = pytest.mark.integration


class Producer:
    """Stands in for the client's Kafka producer: what it sends lands in ``published``."""

    def __init__(self, published: Published) -> None:
        self.published = published

    async def send_and_wait(self, topic: str, payload: bytes, key: bytes | None = None, **_: Any) -> None:
        await self.published(topic, payload, key)


@pytest.fixture
def client(parts: Parts, settings: Settings, published: Published) -> Client:
    return Client(settings, parts.store, cast(AIOKafkaProducer, Producer(published)))


async def stored(parts: Parts, cid: str = "c", turns: int = 20) -> None:
    for seq in range(1, turns + 1):
        message = (
            user(f"question {seq}: " + "detail " * 60)
            if seq % 2
            else assistant(f"answer {seq}: " + "so " * 60)
        )
        await parts.turns.handle(turn_bytes(cid, seq, [message]), cid.encode())


async def compacted(parts: Parts, cid: str = "c") -> CompactionCompleted:
    await parts.jobs.schedule(cid, Trigger.MANUAL)
    done = await run_job(parts.jobs, parts.compactor, cid)
    assert done is not None
    assert done.outcome is Outcome.COMPACTED, done.error
    return done


READS: dict[str, Callable[[Client], Awaitable[object]]] = {
    "messages": lambda c: c.messages("nope"),
    "status": lambda c: c.status("nope"),
    "proposal": lambda c: c.proposal("nope"),
    "preview_compaction": lambda c: c.preview_compaction("nope"),
    "versions": lambda c: c.versions("nope"),
    "compactions": lambda c: c.compactions("nope"),
    "transcript": lambda c: c.transcript("nope"),
    "context_stats": lambda c: c.context_stats("nope"),
    "artifacts": lambda c: c.artifacts("nope"),
    "pin": lambda c: c.pin("nope", 1),
    "unpin": lambda c: c.unpin("nope", 1),
    "rewind": lambda c: c.rewind("nope"),
    "apply": lambda c: c.apply("nope", uuid.uuid4()),
    "discard": lambda c: c.discard("nope", uuid.uuid4()),
}


@pytest.mark.parametrize("call", list(READS), ids=list(READS))
async def test_a_conversation_that_does_not_exist_is_not_found(
    client: Client, parts: Parts, call: str
) -> None:
    """Every read or command on a conversation no turn of which is stored says so, instead of an empty
    or noop answer (a settings write alone stores no turn)."""
    await client.set_profile("nope", None)
    with pytest.raises(ConversationNotFound) as raised:
        await READS[call](client)
    assert str(raised.value).startswith("no conversation 'nope' is stored")
    assert "check the id, or publish its first turn" in str(raised.value)
    assert raised.value.conversation_id == "nope"
    assert isinstance(raised.value, CompactionWorkerError)
    assert isinstance(raised.value, LookupError)
    assert not await client.exists("nope")
    await stored(parts, "nope", 1)
    assert await client.exists("nope")


async def test_unpin_of_a_message_never_pinned_is_refused(client: Client, parts: Parts) -> None:
    """An unpin that would change nothing says so (it used to return ordinals as if it had)."""
    await stored(parts, turns=4)
    with pytest.raises(NotPinned) as raised:
        await client.unpin("c", 2)
    assert str(raised.value).startswith("turn 2 of c is not pinned: there is nothing to unpin")
    assert isinstance(raised.value, PinError)
    with pytest.raises(NotPinned, match=r"^message 0 of turn 3 of c is not pinned"):
        await client.unpin("c", 3, index=0)
    assert await client.pin("c", 2) == [2]
    assert await client.unpin("c", 2) == [2]  # pinned, then unpinned: once
    with pytest.raises(NotPinned):
        await client.unpin("c", 2)


async def test_a_pin_of_no_such_message_names_what_there_is(client: Client, parts: Parts) -> None:
    await stored(parts, turns=4)
    with pytest.raises(NoSuchMessage, match=r"^c has no turn 9 with messages \(its last turn is 4\)"):
        await client.pin("c", 9)
    with pytest.raises(NoSuchMessage, match=r"^turn 2 of c has 1 messages, no index 3: name one from 0 to 0"):
        await client.pin("c", 2, index=3)


async def test_a_malformed_proposal_id_is_a_proposal_error(client: Client, parts: Parts) -> None:
    """``apply(cid, "nope")`` used to raise a bare ValueError: badly formed hexadecimal UUID string."""
    await stored(parts, turns=2)
    for call in (client.apply, client.discard):
        with pytest.raises(InvalidProposalId) as raised:
            await call("c", "nope")
        assert str(raised.value).startswith("c: 'nope' is not a proposal id (a UUID)")
        assert "compaction_id of its compaction.proposed event" in str(raised.value)
        assert isinstance(raised.value, ProposalError)
        assert isinstance(raised.value, ValueError)


async def test_a_proposal_that_does_not_wait_is_not_pending(client: Client, parts: Parts) -> None:
    await stored(parts, turns=2)
    missing = uuid.uuid4()
    with pytest.raises(ProposalNotPending) as raised:
        await client.apply("c", str(missing))
    assert str(raised.value).startswith(f"c: proposal {missing} is not pending (none is)")
    assert "Client.proposal shows the one that waits" in str(raised.value)
    assert isinstance(raised.value, ProposalError)


async def test_a_rewind_past_the_first_version_is_nothing_to_rewind(
    client: Client, parts: Parts, published: Published
) -> None:
    """Never compacted, every compaction undone, or a version under 1: nothing to undo, said so; a
    version that is no compaction is NoSuchVersion. A rewind's own event says ``rewound``."""
    await stored(parts)
    with pytest.raises(NothingToRewind) as raised:
        await client.rewind("c")
    assert str(raised.value).startswith("c: nothing to undo: no committed compaction is in effect")
    assert "Client.versions" in str(raised.value)
    assert isinstance(raised.value, RewindError)

    await compacted(parts)
    rewound = await client.rewind("c")
    assert (rewound.rewound_version, rewound.completed.outcome) == (1, Outcome.REWOUND)
    assert [e["outcome"] for e in published.on("compaction.completed")] == ["compacted", "rewound"]
    with pytest.raises(NothingToRewind, match=r"^c: nothing to undo: .*every one is undone already"):
        await client.rewind("c")
    with pytest.raises(NothingToRewind, match=r"^c: nothing to undo before version 1, its first compaction"):
        await client.rewind("c", 0)
    with pytest.raises(NoSuchVersion, match=r"^c: no compaction version 7 \(compactions: 1\)"):
        await client.rewind("c", 7)
    with pytest.raises(NoSuchVersion, match=r"^c: version 2 is a rewind, not a compaction"):
        await client.rewind("c", 2)


async def test_a_turn_over_the_event_limit_is_refused_before_it_is_published(
    client: Client, published: Published
) -> None:
    """The worker would dead-letter it unread (no conversation to record it for): the client says so."""
    big = turn_event("c", 1, [user("x" * client.settings.kafka.max_event_bytes)])
    with pytest.raises(TurnRejected) as raised:
        await client.publish_turn(big)
    assert (raised.value.conversation_id, raised.value.turn_seq, raised.value.reason) == ("c", 1, "oversized")
    assert "over the 16384-byte limit; not published" in str(raised.value)
    assert "split its messages over several turns" in str(raised.value)
    assert published.events == []
