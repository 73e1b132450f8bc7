"""A conversation's status, read in one round trip, and what it says about a wait, against a real Redis."""

from __future__ import annotations

import ast
import time
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
import redis.asyncio

import compaction_worker
from compaction_worker import strategies
from compaction_worker.contracts.events import ContextStatus, Outcome, Trigger
from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.conversation.meta import JOB_FIELDS, JOB_PRIORITY, Meta, write_field
from compaction_worker.conversation.status import LISTED, Status, read_status, read_statuses
from compaction_worker.settings import DEFAULT_INDEX_SHARDS
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.proposals import Proposal, Proposals
from compaction_worker.state.store import Store
from compaction_worker.state.wake import Wakes
from tests.state.helpers import append_turn, msg

PREFIX = "t"
TTL = 5.0


@pytest.fixture
def store(redis_client: redis.asyncio.Redis) -> Store:
    return Store(redis_client, PREFIX, retention_seconds=3600)


@pytest.fixture
def queue(redis_client: redis.asyncio.Redis) -> JobQueue:
    return JobQueue(
        redis_client,
        PREFIX,
        Locks(redis_client, TTL),
        shards=DEFAULT_INDEX_SHARDS,
        wakes=Wakes(redis_client, PREFIX),
    )


async def status_of(store: Store, queue: JobQueue, cid: str, *, proposal: bool = False) -> Status:
    return await read_status(store.redis, cid, store.keys(cid), queue.index, proposal=proposal)


async def turns(store: Store, cid: str, count: int) -> None:
    meta = await store.meta(cid)
    for seq in range(meta.last_seq + 1, meta.last_seq + count + 1):
        await append_turn(store, cid, seq, [msg(f"turn {seq}")])


async def lock(queue: JobQueue, cid: str) -> Lease:
    lease = await queue.locks.acquire(cid, conversation_keys(cid, PREFIX))
    assert isinstance(lease, Lease)
    return lease


@pytest.mark.integration
class TestReadStatus:
    async def test_no_conversation(self, store: Store, queue: JobQueue) -> None:
        """An unknown conversation: nothing stored, nothing pending; a wait for no job is over at
        once, one for a turn or a version is not."""
        status = await status_of(store, queue, "none", proposal=True)
        assert (status.stored, status.version, status.last_seq, status.profile) == (False, 0, 0, "")
        assert (status.locked, status.job, status.proposal_waits, status.proposal) == (
            False,
            None,
            False,
            None,
        )
        assert status.context_status is ContextStatus.FULL
        assert status.reached(None, 0) == 0
        assert status.reached(None, 1) is None
        assert status.reached(1, 0) is None

    async def test_appended_turns_only(self, store: Store, queue: JobQueue) -> None:
        """Turns stored, no job: the wait is over once the turns it waits for are stored."""
        await turns(store, "c", 3)
        await write_field(store.redis, store.keys("c").meta, "profile", "sub", store.retention_ms)

        status = await status_of(store, queue, "c")

        assert status.meta == await store.meta("c")
        assert (status.stored, status.last_seq, status.version, status.profile) == (True, 3, 0, "sub")
        assert (status.job, status.locked, status.proposal_waits) == (None, False, False)
        assert status.settled()
        assert status.reached(None, 3) == 0
        assert status.reached(None, 4) is None  # a turn published and not stored yet
        assert status.reached(0, 3) == 0
        assert status.reached(1, 3) is None

    async def test_pending_job(self, store: Store, queue: JobQueue) -> None:
        """A job scheduled and not running: pending, due now; a wait for a version does not care."""
        await turns(store, "c", 2)
        before = time.time()
        await queue.schedule("c", Trigger.MANUAL)

        status = await status_of(store, queue, "c")

        job = status.job
        assert job is not None
        assert (job.trigger, job.running, job.retry_after) == (Trigger.MANUAL, False, 0.0)
        assert job.id == (await queue.job("c")).id  # type: ignore[union-attr]  # scheduled above
        assert job.due_at is not None
        assert before - 1 <= job.due_at <= time.time() + 1
        assert not job.backing_off(time.time())
        assert not status.settled()
        assert status.reached(None, 2) is None
        assert status.reached(0, 2) == 0

    @pytest.mark.parametrize("trigger", list(JOB_PRIORITY))
    async def test_every_trigger_is_read_back(self, store: Store, queue: JobQueue, trigger: Trigger) -> None:
        """The meta keeps the job's priority: each trigger has its own, and the status names it."""
        await turns(store, "c", 1)
        await queue.schedule("c", trigger)
        job = (await status_of(store, queue, "c")).job
        assert job is not None
        assert job.trigger is trigger

    async def test_running_job(self, store: Store, queue: JobQueue) -> None:
        """A job whose lock is held is under way: pending even when its entry is scored later."""
        await turns(store, "c", 1)
        await queue.schedule("c", Trigger.THRESHOLD, delay_seconds=60)
        await store.set_meta("c", retry_after=time.time() + 60)
        await lock(queue, "c")

        status = await status_of(store, queue, "c")

        assert status.locked
        assert status.job is not None
        assert status.job.running
        assert not status.job.backing_off(time.time())
        assert status.reached(None, 1) is None

    async def test_a_held_lock_without_a_job_is_a_run_finishing(self, store: Store, queue: JobQueue) -> None:
        """A run drops its job, may schedule the next, then lets the lock go: until then, not settled."""
        await turns(store, "c", 1)
        await lock(queue, "c")

        status = await status_of(store, queue, "c")

        assert (status.job, status.locked) == (None, True)
        assert status.reached(None, 1) is None
        assert status.reached(0, 1) == 0

    async def test_backing_off(self, store: Store, queue: JobQueue) -> None:
        """A failed run's retry waiting out its backoff: nothing runs or is due until then, so a
        wait for no job is over; once the backoff ends (or the entry is due), it is not."""
        await turns(store, "c", 1)
        await queue.schedule("c", Trigger.MANUAL, delay_seconds=60)
        until = time.time() + 60
        await store.set_meta("c", retry_after=until, failures=1)

        status = await status_of(store, queue, "c")

        job = status.job
        assert job is not None
        assert job.backing_off(time.time())
        assert job.backing_off_until(time.time()) == until
        assert status.meta.failures == 1
        assert status.reached(None, 1) == 0
        # Later than the backoff, or once the index makes it due, it is pending again.
        assert status.reached(None, 1, now=until + 1) is None
        await queue.mark_due("c")
        assert (await status_of(store, queue, "c")).reached(None, 1) is None

    async def test_waiting_proposal_fresh_then_stale(self, store: Store, queue: JobQueue) -> None:
        """A proposal computed from the history as it is waits fresh; a turn since makes it stale,
        as ``Proposal.matches`` says of a snapshot."""
        await turns(store, "c", 3)
        snapshot = await store.snapshot("c")
        proposal = proposal_from(snapshot.meta, snapshot.entry_count)
        await Proposals(store).put("c", proposal)

        light = await status_of(store, queue, "c")
        assert (light.proposal_waits, light.proposal) == (True, None)
        waiting = (await status_of(store, queue, "c", proposal=True)).proposal
        assert waiting is not None
        assert (waiting.compaction_id, waiting.trigger) == (proposal.compaction_id, Trigger.THRESHOLD)
        assert (waiting.stale, waiting.turns_since) == (False, 0)
        assert (waiting.tokens_before, waiting.tokens_after) == (90, 20)
        assert waiting.proposal == proposal

        await turns(store, "c", 2)

        waiting = (await status_of(store, queue, "c", proposal=True)).proposal
        assert waiting is not None
        assert (waiting.stale, waiting.turns_since) == (True, 2)
        assert proposal.matches(await store.snapshot("c")) is False

    async def test_a_proposal_matches_the_history_with_entries_listed(
        self, store: Store, queue: JobQueue
    ) -> None:
        """The entry count a status counts (listed entries, then the transcript's tail) is the
        snapshot's, also once a commit moved messages to the entries list."""
        await turns(store, "c", 4)
        entries = (await store.snapshot("c")).history.entries
        await store.redis.rpush(store.keys("c").entries, *(e.to_json() for e in entries[:2]))
        await store.set_meta("c", tail=2)
        snapshot = await store.snapshot("c")
        assert snapshot.listed == 2
        assert snapshot.entry_count == 4
        await Proposals(store).put("c", proposal_from(snapshot.meta, snapshot.entry_count))

        waiting = (await status_of(store, queue, "c", proposal=True)).proposal

        assert waiting is not None
        assert not waiting.stale
        await Proposals(store).put("c", proposal_from(snapshot.meta, snapshot.entry_count + 1))
        waiting = (await status_of(store, queue, "c", proposal=True)).proposal
        assert waiting is not None
        assert waiting.stale

    async def test_many_statuses_in_one_read(self, store: Store, queue: JobQueue) -> None:
        """Many conversations' statuses: each meta as stored but its long texts, each job and lock."""
        await turns(store, "a", 2)
        await turns(store, "b", 1)
        await store.set_meta("b", system_prompt="a long system prompt")
        await queue.schedule("b", Trigger.REACTIVE)
        await lock(queue, "b")

        a, b, none = await read_statuses(store.redis, ["a", "b", "none"], PREFIX, queue.index)

        assert (a.conversation_id, a.meta, a.job, a.locked) == ("a", await store.meta("a"), None, False)
        assert b.meta.system_prompt is None  # not read for a list
        assert b.meta.last_seq == 1
        assert b.job is not None
        assert b.job.trigger is Trigger.REACTIVE
        assert b.job.running
        assert b.locked
        assert not none.stored
        assert await read_statuses(store.redis, [], PREFIX, queue.index) == []

    def test_a_list_reads_every_meta_field_but_the_long_texts(self) -> None:
        assert set(LISTED) == {f.name for f in fields(Meta)} - {
            "system_prompt",
            "tools",
            "instructions",
            "pins",
            "job_instructions",
        }


def proposal_from(meta: Meta, entry_count: int) -> Proposal:
    """A proposal computed from a conversation at ``meta`` with ``entry_count`` verbatim entries (90 -> 20 tokens)."""
    result = strategies.CompactionResult(
        outcome=Outcome.COMPACTED,
        draft=strategies.Draft((), ()),
        tokens_before=90,
        tokens_after=10,
        messages_before=3,
        messages_after=1,
    )
    return Proposal(
        compaction_id=uuid.uuid4(),
        trigger=Trigger.THRESHOLD,
        version=meta.version,
        last_seq=meta.last_seq,
        entry_count=entry_count,
        window=1000,
        target=500,
        scale=2.0,
        tokens_before=90,
        circuit_open=False,
        llm_failures=0,
        duration_ms=1,
        result=result,
    )


# --- no caller reads the meta hash's fields itself -----------------------------------------

ROOT = Path(compaction_worker.__file__).parent
HASH_READS = frozenset({"hget", "hmget", "hgetall", "hexists", "hstrlen"})
META_FIELDS = frozenset({f.name for f in fields(Meta)} | set(JOB_FIELDS))


def raw_meta_reads(source: str) -> Iterator[tuple[int, str]]:
    """Each hash read in ``source`` that names a meta field (a literal, or a module-level tuple or
    list of them), or reads a key named ``meta``: (line, what)."""
    tree = ast.parse(source)
    named: dict[str, set[str]] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            texts = {
                c.value
                for c in ast.walk(statement.value)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
            named |= {target.id: texts for target in targets if isinstance(target, ast.Name)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in HASH_READS:
            continue
        found: set[str] = set()
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for part in ast.walk(arg):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found |= {part.value} & META_FIELDS
                elif isinstance(part, ast.Name):
                    found |= named.get(part.id, set()) & META_FIELDS
        if found:
            yield node.lineno, f"{node.func.attr} names {', '.join(sorted(found))}"
        elif node.args and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "meta":
            yield node.lineno, f"{node.func.attr} reads the meta hash itself"


class TestOneStatus:
    """The client and the inspector ask the status (or the store's ``Meta``), never the hash's fields."""

    @pytest.mark.parametrize("package", ["client", "inspector"])
    def test_no_raw_meta_field_reads(self, package: str) -> None:
        found = [
            f"{path.relative_to(ROOT)}:{line}: {what}"
            for path in sorted((ROOT / package).rglob("*.py"))
            for line, what in raw_meta_reads(path.read_text())
        ]
        assert not found, "read the status (compaction_worker/conversation/status.py) instead:\n" + "\n".join(
            found
        )

    def test_the_check_catches_a_raw_read(self) -> None:
        """What ``Client._reached`` and the inspector's list did before the status, each caught."""
        before = """
LIST_FIELDS = ("last_seq", "profile")

async def reached(pipe, keys, redis, key):
    pipe.hmget(keys.meta, "version", "last_seq", "retry_after", "job_id")
    pipe.hmget(key, list(LIST_FIELDS))
    await redis.hget(key, "job_trigger")
    await redis.hgetall(keys.meta)
    await redis.hget(keys.fingerprints, "3")
"""
        assert [line for line, _ in raw_meta_reads(before)] == [5, 6, 7, 8]
