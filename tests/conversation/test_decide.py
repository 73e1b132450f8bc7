"""A turn's one decision (``decide``): its write, its revision, its hold and its profile; and what its
append records of compaction instructions (the standing meta field, the request's in its job)."""

from __future__ import annotations

from typing import Any

from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import CompactionMode, CompactionRequest, Trigger
from compaction_worker.conversation.apply import UNKNOWN_REV, NewMessage
from compaction_worker.conversation.decide import decide, plan_append
from compaction_worker.conversation.meta import JOB_PRIORITY, JobRequest, Meta
from compaction_worker.settings import BudgetSettings, Settings
from compaction_worker.state.gaps import parse_held
from compaction_worker.testing import turn_event

SETTINGS = BudgetSettings()
COUNTER = counter_for("gpt-4o-mini", SETTINGS)


def _plan(meta: Meta, request: JobRequest | None = None, **fields: Any) -> Any:
    event = turn_event("c1", meta.last_seq + 1, [{"role": "user", "content": "hi"}], **fields)
    new = [NewMessage(m.to_dict(), 5) for m in event.messages]
    return plan_append(event, meta, new, request, counter=COUNTER, settings=SETTINGS, now=1.0)


class TestStanding:
    """``compaction_instructions`` sets the meta field; empty clears it; absent leaves it."""

    def test_set_clear_and_leave(self) -> None:
        """Set (stripped), stored only when it changes; "" writes the empty field; absent writes nothing."""
        first = _plan(Meta(), compaction_instructions="  keep the plan ")
        assert first.fields["instructions"] == "keep the plan"
        assert first.after.instructions == "keep the plan"
        held = Meta(last_seq=1, model="gpt-4o-mini", instructions="keep the plan")
        assert "instructions" not in _plan(held, compaction_instructions="keep the plan").fields
        assert "instructions" not in _plan(held).fields
        cleared = _plan(held, compaction_instructions="")
        assert cleared.fields["instructions"] == ""
        assert cleared.after.instructions == ""


class TestRequest:
    """A request's instructions travel with its job (the meta's job fields keep them)."""

    def test_the_job_carries_them(self) -> None:
        """The manual request's job has the instructions; without any it has none."""
        asked = CompactionRequest(mode=CompactionMode.FORCE, instructions=" keep test names ")
        plan = _plan(Meta(), JobRequest(Trigger.MANUAL), compaction=asked.model_dump())
        assert plan.job.instructions == "keep test names"
        assert plan.fields["job_instructions"] == plan.after.job_instructions == "keep test names"
        assert plan.due
        bare = _plan(Meta(), JobRequest(Trigger.MANUAL), compaction={"mode": "force"})
        assert bare.job.instructions is None
        assert bare.fields["job_instructions"] == ""

    def test_a_pending_job_is_kept_replaced_or_given_the_instructions(self) -> None:
        """Decided on the meta: a weaker request writes nothing and is not due; an asked-for one of
        equal priority adds its instructions and is due at once; a stronger one replaces the job,
        carrying the pending job's instructions after its own."""
        pending = _plan(
            Meta(), JobRequest(Trigger.MANUAL), compaction={"mode": "force", "instructions": "a"}
        ).after
        weaker = _plan(pending, JobRequest(Trigger.THRESHOLD))
        assert (weaker.due, {k for k in weaker.fields if k.startswith("job_")}) == (False, set())
        same = _plan(pending, JobRequest(Trigger.MANUAL), compaction={"mode": "force", "instructions": "b"})
        assert same.due
        assert {k: v for k, v in same.fields.items() if k.startswith("job_")} == {
            "job_instructions": "a\n\nb"
        }
        assert same.after.job_id == pending.job_id
        stronger = _plan(
            pending,
            JobRequest(Trigger.REACTIVE, "too long"),
            compaction={"mode": "force", "instructions": "c"},
        )
        assert (stronger.due, stronger.after.job_priority) == (True, JOB_PRIORITY[Trigger.REACTIVE])
        assert stronger.after.job_id != pending.job_id
        assert stronger.fields["job_instructions"] == "c\n\na"


class TestPlanTurn:
    """``decide``: what the per-turn path and a run send the script for a turn."""

    def test_the_write_is_the_turn_counted_fingerprinted_and_planned(self) -> None:
        """Its messages as stored, numbered after the meta's; the event's fingerprint; the plan's fields."""
        meta = Meta(last_seq=2, msg_count=5, rev=7, model="gpt-4o-mini", history_tokens=40)
        event = turn_event(
            "c1", 3, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        )
        turn = decide(meta, event, Settings())
        write = turn.write
        assert (write.seq, write.first_n, write.rev, write.first) == (3, 6, 7, False)
        assert [m.message for m in write.messages] == [m.to_dict() for m in event.messages]
        assert write.fingerprint == event.fingerprint()
        assert write.fields == turn.plan.fields
        assert write.fields["msg_count"] == "7"
        added = sum(m.tokens for m in write.messages)
        assert added > 0
        assert turn.plan.after.history_tokens == 40 + added
        assert (turn.plan.after.rev, write.held) == (8, None)

    def test_without_a_known_meta_the_revision_is_unknown_but_for_a_first_turn(self) -> None:
        """The script answers an unknown revision with the stored meta; a first turn is a new conversation's."""
        later = decide(None, turn_event("c1", 4, [{"role": "user", "content": "hi"}]), Settings())
        first = decide(None, turn_event("c1", 1, [{"role": "user", "content": "hi"}]), Settings())
        assert later.write.rev == UNKNOWN_REV
        assert (first.write.rev, first.write.first, first.plan.first) == (0, True, True)
        assert set(first.write.fields) >= {"created_at", "version", "context_status"}

    def test_a_hold_sends_the_held_form(self) -> None:
        """The event's bytes, its hold time and its fingerprint, as the gap index reads them."""
        event = turn_event("c1", 5, [{"role": "user", "content": "hi"}])
        raw = event.model_dump_json().encode()
        turn = decide(None, event, Settings(), hold=(raw, 1234))
        assert turn.write.held is not None
        held = parse_held(5, turn.write.held)
        assert (held.held_ms, held.raw, held.fingerprint) == (1234, raw, event.fingerprint())

    def test_the_turn_s_profile_sets_its_budget_else_the_conversation_s(self) -> None:
        """A profile's trigger fraction moves the threshold: asked by the turn, or kept by the meta."""
        settings = Settings.model_validate(
            {"profiles": {"small": {"budget": {"trigger_fraction": 0.3, "target_fraction": 0.15}}}}
        )
        message = [{"role": "user", "content": "hi"}]
        plain = decide(Meta(), turn_event("c1", 1, message), settings).plan.after
        asked = decide(Meta(), turn_event("c1", 1, message, profile="small"), settings).plan.after
        kept = decide(Meta(last_seq=1, profile="small"), turn_event("c1", 2, message), settings).plan.after
        assert asked.profile == "small"
        assert asked.threshold < plain.threshold
        assert kept.threshold == asked.threshold
