"""What a turn's append records of compaction instructions: the standing meta field, the request's in its job."""

from __future__ import annotations

from typing import Any

from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import CompactionMode, CompactionRequest, Trigger
from compaction_worker.runtime.plan import plan_append
from compaction_worker.settings import BudgetSettings
from compaction_worker.state.appends import NewMessage
from compaction_worker.state.jobs import JobRequest
from compaction_worker.state.meta import Meta
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
    """A request's instructions travel with its job (the job hash keeps them)."""

    def test_the_job_carries_them(self) -> None:
        """The manual request's job has the instructions; without any it has none."""
        asked = CompactionRequest(mode=CompactionMode.FORCE, instructions=" keep test names ")
        plan = _plan(Meta(), JobRequest(Trigger.MANUAL), compaction=asked.model_dump())
        assert plan.job.instructions == "keep test names"
        assert plan.job.fields()["instructions"] == "keep test names"
        bare = _plan(Meta(), JobRequest(Trigger.MANUAL), compaction={"mode": "force"})
        assert bare.job.instructions is None
        assert bare.job.fields()["instructions"] == ""
