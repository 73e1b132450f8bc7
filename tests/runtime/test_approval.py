"""Settings profiles and approval (issue 37): a conversation compacts on its own profile's terms;
under ``pipeline.approval: manual`` a compaction is proposed, applied exactly as proposed, recomputed
when stale, discarded on request, and never waited for after an overflow. Real Redis, the
production wiring (the broker's side: tests/integration/test_profiles.py)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from compaction_worker.contracts.events import CompactionCompleted, CompactionProposed, Outcome, Trigger
from compaction_worker.contracts.history import render
from compaction_worker.errors import ProposalError
from compaction_worker.runtime.compactor import AT_WINDOW_UNAPPROVED, REACTIVE_UNAPPROVED
from compaction_worker.runtime.pool import run_job
from compaction_worker.runtime.preview import proposal_preview
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.proposals import Proposal
from compaction_worker.testing import turn_bytes
from tests.orchestration import Parts, Published, assistant, make_parts, make_settings, user

pytestmark = pytest.mark.integration

REVIEWED = {"reviewed": {"pipeline": {"approval": "manual"}}}
EAGER = {"eager": {"budget": {"trigger_fraction": 0.3, "target_fraction": 0.15}}}


CROSSED = 18
"""The turns that cross the threshold (1,228 tokens of a 2,048-token window, :func:`turn`)."""
AT_WINDOW = 22
"""The turns that reach what the window leaves for input (1,536 tokens): approval no longer waited for."""


def turn(cid: str, seq: int, window: int = 2048, **fields: Any) -> bytes:
    """Turn ``seq`` of ``cid``: about 70 tokens, on a 2,048-token window."""
    msg = (
        user(f"question {seq}: " + "detail " * 60)
        if seq % 2
        else assistant(f"answer {seq}: " + "because " * 60)
    )
    first = {"system_prompt": "Be brief."} if seq == 1 else {}
    return turn_bytes(cid, seq, [msg], context_window=window, **first, **fields)


async def turns(parts: Parts, cid: str, seqs: range, window: int = 2048, **first: Any) -> None:
    for seq in seqs:
        fields = first if seq == seqs.start else {}
        await parts.turns.handle(turn(cid, seq, window, **fields), cid.encode())


def proposed(published: Published) -> list[CompactionProposed]:
    return [CompactionProposed.model_validate(e) for e in published.on("compaction.proposed")]


def completed(published: Published) -> list[CompactionCompleted]:
    return [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]


@pytest.fixture
def manual(redis_client: RedisClient, published: Published) -> Parts:
    """The wiring of a deployment whose compactions wait for approval."""
    return make_parts(redis_client, make_settings(pipeline={"approval": "manual"}), published)


class TestProposals:
    async def test_a_threshold_compaction_is_proposed_and_nothing_is_committed(
        self, manual: Parts, published: Published
    ) -> None:
        await turns(manual, "c", range(1, CROSSED + 1))
        assert await run_job(manual.jobs, manual.compactor, "c") is None
        (started,) = published.on("compaction.started")
        (event,) = proposed(published)
        assert str(event.compaction_id) == started["compaction_id"]
        assert (event.trigger, event.version, event.last_seq) == (Trigger.THRESHOLD, 0, CROSSED)
        assert event.tokens_after < event.tokens_before
        assert event.summary is not None
        assert completed(published) == []
        assert (await manual.store.meta("c")).version == 0
        assert await manual.jobs.job("c") is None

    async def test_apply_commits_exactly_the_proposed_history(
        self, manual: Parts, published: Published
    ) -> None:
        """A preview equals what applying it commits, byte for byte; the completion pairs with the
        run's started event by compaction id."""
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        (event,) = proposed(published)
        pending = await manual.compactor.proposals.get("c")
        assert pending is not None
        shown = proposal_preview("c", pending, await manual.store.snapshot("c"), manual.settings)
        assert shown.compaction_id == event.compaction_id
        assert shown.error is None

        done = await manual.compactor.apply("c", event.compaction_id)

        assert done is not None
        assert (done.outcome, done.compaction_id, done.version) == (Outcome.COMPACTED, event.compaction_id, 1)
        assert render((await manual.store.snapshot("c")).history) == shown.messages
        assert completed(published) == [done]
        assert await manual.compactor.proposals.get("c") is None
        with pytest.raises(ProposalError, match="not pending"):
            await manual.compactor.apply("c", event.compaction_id)

    async def test_a_proposal_waiting_holds_the_threshold_back(
        self, manual: Parts, published: Published
    ) -> None:
        """More turns over the threshold do not propose again (and pay another summary) while one waits."""
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        await turns(manual, "c", range(CROSSED + 1, AT_WINDOW))
        assert await manual.jobs.job("c") is not None
        assert await run_job(manual.jobs, manual.compactor, "c") is None
        assert len(proposed(published)) == 1
        assert len(published.on("compaction.started")) == 1

    async def test_a_stale_proposal_is_recomputed_not_applied(
        self, manual: Parts, published: Published
    ) -> None:
        """Turns arrived after it: apply schedules a manual run, which proposes anew (replacing it)."""
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        (first,) = proposed(published)
        await turns(manual, "c", range(CROSSED + 1, CROSSED + 3))

        assert await manual.compactor.apply("c", first.compaction_id) is None
        assert (await manual.store.meta("c")).version == 0
        assert await run_job(manual.jobs, manual.compactor, "c") is None

        _, second = proposed(published)
        (dropped,) = completed(published)
        assert (second.trigger, second.last_seq, second.replaces) == (
            Trigger.MANUAL,
            CROSSED + 2,
            first.compaction_id,
        )
        assert (dropped.compaction_id, dropped.outcome) == (first.compaction_id, Outcome.DISCARDED)
        assert str(second.compaction_id) in (dropped.error or "")
        done = await manual.compactor.apply("c", second.compaction_id)
        assert done is not None
        assert done.outcome is Outcome.COMPACTED

    async def test_discard_ends_the_run_and_a_discarded_proposal_cannot_be_applied(
        self, manual: Parts, published: Published
    ) -> None:
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        (event,) = proposed(published)
        await manual.compactor.discard("c", event.compaction_id)
        (done,) = completed(published)
        assert (done.compaction_id, done.outcome, done.version) == (event.compaction_id, Outcome.DISCARDED, 0)
        assert done.error == "discarded by the runtime"
        with pytest.raises(ProposalError):
            await manual.compactor.apply("c", event.compaction_id)
        with pytest.raises(ProposalError):
            await manual.compactor.discard("c", uuid.uuid4())

    async def test_an_overflow_never_waits_for_approval(self, manual: Parts, published: Published) -> None:
        """A reactive compaction commits at once, says so, and ends the proposal it makes moot."""
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        (event,) = proposed(published)
        overflow = {"mode": "overflow", "error": "prompt is too long: 2100 tokens > 2048 maximum"}
        await manual.turns.handle(turn("c", CROSSED + 1, compaction=overflow), b"c")

        done = await run_job(manual.jobs, manual.compactor, "c")

        assert done is not None
        assert (done.trigger, done.outcome, done.version) == (Trigger.REACTIVE, Outcome.COMPACTED, 1)
        assert REACTIVE_UNAPPROVED in done.notes
        dropped = next(c for c in completed(published) if c.compaction_id == event.compaction_id)
        assert dropped.outcome is Outcome.DISCARDED
        assert await manual.compactor.proposals.get("c") is None


class TestAtTheWindow:
    """Invariant 14: at what its window leaves for input (1,536 tokens here) a history never waits for
    an approval: the run commits, says it did not wait, and ends the proposal it made moot."""

    async def test_a_waiting_proposal_gives_way_at_the_window(
        self, manual: Parts, published: Published
    ) -> None:
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        (event,) = proposed(published)
        await turns(manual, "c", range(CROSSED + 1, AT_WINDOW))
        assert await run_job(manual.jobs, manual.compactor, "c") is None  # under the window: it waits
        await manual.turns.handle(turn("c", AT_WINDOW), b"c")

        done = await run_job(manual.jobs, manual.compactor, "c")

        assert done is not None
        assert (done.trigger, done.outcome, done.version) == (Trigger.THRESHOLD, Outcome.COMPACTED, 1)
        assert AT_WINDOW_UNAPPROVED in done.notes
        assert done.tokens_before >= 1536
        assert done.tokens_after <= done.target
        assert (await manual.store.meta("c")).version == 1
        dropped = next(c for c in completed(published) if c.compaction_id == event.compaction_id)
        assert (dropped.outcome, dropped.version) == (Outcome.DISCARDED, 1)  # the version that replaced it
        assert dropped.error == (
            f"the history reached what its window leaves for input ({done.tokens_before} of 1536 tokens): "
            "a compaction without approval replaced it"
        )
        assert await manual.compactor.proposals.get("c") is None
        assert len(proposed(published)) == 1

    async def test_a_turn_that_jumps_to_the_window_is_not_proposed(
        self, manual: Parts, published: Published
    ) -> None:
        """From under the threshold to past the window in one turn: the first run commits at once."""
        await turns(manual, "c", range(1, CROSSED))
        assert await manual.jobs.job("c") is None
        big = user("a long paste: " + "detail " * 400)
        await manual.turns.handle(turn_bytes("c", CROSSED, [big], context_window=2048), b"c")

        done = await run_job(manual.jobs, manual.compactor, "c")

        assert done is not None
        assert (done.outcome, done.version) == (Outcome.COMPACTED, 1)
        assert AT_WINDOW_UNAPPROVED in done.notes
        assert proposed(published) == []

    async def test_a_manual_request_under_the_window_still_proposes(
        self, manual: Parts, published: Published
    ) -> None:
        """Only the window overrides approval: a forced run below it proposes, as before."""
        await turns(manual, "c", range(1, 11))
        await manual.turns.handle(turn("c", 11, compaction={"mode": "force"}), b"c")
        assert await run_job(manual.jobs, manual.compactor, "c") is None
        (event,) = proposed(published)
        assert event.trigger is Trigger.MANUAL
        assert (await manual.store.meta("c")).version == 0


class TestStaleProposal:
    """``Client.proposal`` shows a proposal as it was proposed, never its messages with later counts."""

    async def test_turns_after_it_mark_it_stale_and_change_nothing_it_shows(
        self, manual: Parts, published: Published
    ) -> None:
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        (event,) = proposed(published)
        pending = await manual.compactor.proposals.get("c")
        assert pending is not None
        fresh = proposal_preview("c", pending, await manual.store.snapshot("c"), manual.settings)
        assert (fresh.stale, fresh.turns_since, fresh.error) == (False, 0, None)
        assert fresh.tokens_before == event.tokens_before == (await manual.store.meta("c")).total_tokens
        assert fresh.replaced > 0

        await turns(manual, "c", range(CROSSED + 1, CROSSED + 3))
        shown = proposal_preview("c", pending, await manual.store.snapshot("c"), manual.settings)

        assert (shown.stale, shown.turns_since) == (True, 2)
        assert shown.error == (
            f"stale: 2 turns arrived since it was proposed (at turn {CROSSED}); applying it recomputes it"
        )
        assert (shown.tokens_before, shown.tokens_after) == (event.tokens_before, event.tokens_after)
        assert (shown.messages, shown.replaced, shown.summary) == (
            fresh.messages,
            fresh.replaced,
            fresh.summary,
        )
        assert (shown.version, shown.compaction_id) == (0, event.compaction_id)

    async def test_a_proposal_stored_before_replaced_was_kept_still_reads(
        self, manual: Parts, published: Published
    ) -> None:
        """A stored proposal without ``replaced`` (an earlier release's) is read, and its count is taken
        on the entries it was computed from, not on the turns since."""
        await turns(manual, "c", range(1, CROSSED + 1))
        await run_job(manual.jobs, manual.compactor, "c")
        pending = await manual.compactor.proposals.get("c")
        assert pending is not None
        assert pending.replaced is not None
        data = json.loads(pending.to_json())
        del data["replaced"]
        legacy = Proposal.from_json(json.dumps(data))
        assert legacy.replaced is None
        await turns(manual, "c", range(CROSSED + 1, CROSSED + 3))

        shown = proposal_preview("c", legacy, await manual.store.snapshot("c"), manual.settings)

        assert shown.stale
        assert shown.replaced == pending.replaced


class TestProfiles:
    async def test_a_profile_set_by_a_turn_gives_the_conversation_its_own_terms(
        self, redis_client: RedisClient, published: Published
    ) -> None:
        """Same turns, same deployment: the conversation in the "eager" profile is due at 30% of what
        its window leaves and compacts to 15%; the other waits for the deployment's 80%."""
        parts = make_parts(redis_client, make_settings(profiles=EAGER), published)
        await turns(parts, "sub", range(1, 41), 8192, profile="eager")
        await turns(parts, "main", range(1, 41), 8192)
        assert (await parts.store.meta("sub")).profile == "eager"
        assert await parts.jobs.job("main") is None
        done = await run_job(parts.jobs, parts.compactor, "sub")
        assert done is not None
        assert (done.outcome, done.target) == (Outcome.COMPACTED, int(0.15 * 6144))
        main, sub = await parts.store.meta("main"), await parts.store.meta("sub")
        assert (main.threshold, sub.threshold) == (int(0.8 * 6144), int(0.3 * 6144))

    async def test_approval_by_profile_and_back_to_the_deployments_settings(
        self, redis_client: RedisClient, published: Published
    ) -> None:
        """A profile can ask for approval; a turn's empty profile returns the conversation to the
        deployment's settings, which commit."""
        parts = make_parts(redis_client, make_settings(profiles=REVIEWED), published)
        await turns(parts, "c", range(1, CROSSED + 1), profile="reviewed")
        assert await run_job(parts.jobs, parts.compactor, "c") is None
        assert len(proposed(published)) == 1
        await parts.turns.handle(turn("c", CROSSED + 1, profile=""), b"c")
        assert (await parts.store.meta("c")).profile == ""
        # The proposal made under the profile waits; a manual request commits without approval now,
        # and ends that proposal's run.
        await parts.turns.handle(turn("c", CROSSED + 2, compaction={"mode": "force"}), b"c")
        done = await run_job(parts.jobs, parts.compactor, "c")
        assert done is not None
        assert done.outcome is Outcome.COMPACTED
        (event,) = proposed(published)
        dropped = next(c for c in completed(published) if c.compaction_id == event.compaction_id)
        assert (dropped.outcome, dropped.error) == (
            Outcome.DISCARDED,
            "a compaction without approval replaced it",
        )
        assert await parts.compactor.proposals.get("c") is None

    async def test_a_profile_the_deployment_lacks_is_dead_lettered(
        self, redis_client: RedisClient, published: Published
    ) -> None:
        parts = make_parts(redis_client, make_settings(profiles=EAGER), published)
        outcome = await parts.turns.handle(turn("c", 1, profile="eagr"), b"c")
        assert outcome.reason == "unknown_profile"
        (letter,) = published.on("conversation.turn.dlq")
        assert "'eagr' is not one of the deployment's profiles (eager)" in letter["detail"]
        assert (await parts.store.meta("c")).last_seq == 0
