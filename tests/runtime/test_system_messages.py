"""The runtime's instructions and its task through the per-turn path and real compactions, over Redis.

A system prompt sent as the first message (the OpenAI convention) is kept exactly as one sent
in ``system_prompt``; a later system message stays verbatim where it was said; the task (the
first user message) survives every compaction.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import render, text_of
from compaction_worker.settings import Settings
from compaction_worker.state.connection import RedisClient
from compaction_worker.strategies import provider_problems
from compaction_worker.summaries.contract import SummaryRequest, SummaryResult
from compaction_worker.testing import turn_bytes
from tests.orchestration import Parts, Published, assistant, compact_now, make_parts, user

pytestmark = pytest.mark.integration

PROMPT = (
    "You are a careful coding agent. Use the `edit` tool for every change, run `pytest -x` after each "
    "edit, and answer in the THOUGHT/ACTION format."
)
TASK = (
    "Fix TimeDelta serialization precision: fields.TimeDelta(precision='milliseconds') returns 344 for "
    "345 ms. The bug is in src/marshmallow/fields.py; keep the public API of marshmallow 3.0.0rc8."
)
REMINDER = "Reminder: you have 5 steps left; submit with `submit` when the tests pass."


def step(k: int, system: Literal["message", "field"]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Step ``k`` of an agent run: the prompt (as a message or the field) and the task, then long steps."""
    fields: dict[str, Any] = {"context_window": 2048}
    if k == 1:
        if system == "field":
            return [user(TASK)], {**fields, "system_prompt": PROMPT}
        return [{"role": "system", "content": PROMPT}, user(TASK)], fields
    if k % 2:
        return [user(f"observation {k}: " + "output line " * 40)], fields
    return [assistant(f"step {k}: " + "I will look at the code " * 12)], fields


async def send(parts: Parts, cid: str, messages: list[dict[str, Any]], **fields: Any) -> None:
    """One turn with the conversation's next seq."""
    seq = (await parts.store.meta(cid)).last_seq + 1
    await parts.turns.handle(turn_bytes(cid, seq, messages, **fields), cid.encode())


async def run_steps(
    parts: Parts, cid: str, steps: range, system: Literal["message", "field"] = "message"
) -> None:
    for k in steps:
        messages, fields = step(k, system)
        await send(parts, cid, messages, **fields)


async def compact(parts: Parts, cid: str) -> None:
    """Run the conversation's due compaction, or ask for one (a manual request is a turn too)."""
    if await parts.jobs.job(cid) is None:
        await send(parts, cid, [], compaction={"mode": "force"})
    completed = await compact_now(parts.jobs, parts.compactor, cid)
    assert completed.outcome is Outcome.COMPACTED, completed.error


class TestSystemPrompt:
    async def test_a_prompt_sent_as_a_message_is_the_prompt_sent_as_the_field(self, parts: Parts) -> None:
        """The same budget before, and the same effective history after two compactions."""
        ways: tuple[Literal["message", "field"], ...] = ("message", "field")
        for how in ways:
            await run_steps(parts, how, range(1, 25), how)
        before = {how: (await parts.store.meta(how)).total_tokens for how in ways}
        assert before["message"] == before["field"]

        for how in ways:
            await compact(parts, how)
            await run_steps(parts, how, range(25, 37), how)
            await compact(parts, how)
        rendered = {how: render((await parts.store.snapshot(how)).history) for how in ways}
        assert rendered["message"] == rendered["field"]
        assert rendered["message"][0] == {"role": "system", "content": PROMPT}
        after = {how: (await parts.store.meta(how)).total_tokens for how in ways}
        assert after["message"] == after["field"]

    async def test_the_prompt_and_the_task_survive_every_compaction_verbatim(self, parts: Parts) -> None:
        """First in every effective history, and the task's words in it once, however often it compacts."""
        await run_steps(parts, "c", range(1, 25))
        for start in range(25, 85, 12):
            await compact(parts, "c")
            await run_steps(parts, "c", range(start, start + 12))
            messages = render((await parts.store.snapshot("c")).history)
            assert messages[0] == {"role": "system", "content": PROMPT}
            assert sum(TASK in text_of(m) for m in messages) == 1
            assert provider_problems(messages) == []
        assert (await parts.store.meta("c")).version >= 5

    async def test_a_later_system_message_stays_where_the_runtime_said_it(self, parts: Parts) -> None:
        """An instruction inside the history: never summarized, joined to the prompt after it."""
        await run_steps(parts, "c", range(1, 13))
        await send(parts, "c", [{"role": "system", "content": REMINDER}, user("go on")])
        await run_steps(parts, "c", range(13, 31))
        await compact(parts, "c")
        await run_steps(parts, "c", range(31, 43))
        await compact(parts, "c")

        history = (await parts.store.snapshot("c")).history
        assert history.chunks
        systems = [e for e in history.entries if e.role == "system"]
        assert [text_of(e.message) for e in systems] == [PROMPT, REMINDER]
        assert render(history)[0] == {"role": "system", "content": f"{PROMPT}\n\n{REMINDER}"}

    async def test_a_new_system_prompt_field_replaces_the_old_one(self, parts: Parts) -> None:
        """A runtime replacing its prompt sends ``system_prompt`` again: the new one is the prompt."""
        await run_steps(parts, "c", range(1, 25), "field")
        await send(parts, "c", [user("now in French")], system_prompt="Réponds en français.")
        first = render((await parts.store.snapshot("c")).history)[0]
        assert first == {"role": "system", "content": "Réponds en français."}

    async def test_a_prompt_larger_than_the_target_is_reported_not_cut(self, parts: Parts) -> None:
        """Nothing can make room for it: the outcome says so and nothing is committed."""
        huge = "Rule: always cite the file and line you change. " * 150
        await send(parts, "c", [{"role": "system", "content": huge}, user(TASK)], context_window=2048)
        await run_steps(parts, "c", range(2, 9))
        await send(parts, "c", [], compaction={"mode": "force"})

        completed = await compact_now(parts.jobs, parts.compactor, "c")

        assert completed.outcome is Outcome.NOOP
        assert completed.error is not None
        assert "system prompt and tool schemas alone" in completed.error
        history = (await parts.store.snapshot("c")).history
        assert text_of(history.entries[0].message) == huge
        assert history.chunks == ()


class Forgetful:
    """A summarizer that keeps nothing of what it read: only what stays verbatim survives it."""

    name = "forgetful"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        text = "The assistant worked on the request."
        return SummaryResult(text, self.name, 8, LlmUsage())


class TestTheUsersWords:
    async def test_the_current_request_is_not_summarized_in_a_long_agent_turn(
        self, redis_client: RedisClient, settings: Settings, published: Published
    ) -> None:
        """Issue 19: a request followed by many tool steps keeps its words verbatim through compaction."""
        parts = make_parts(redis_client, settings, published, summarizers=lambda _m, _c: [Forgetful()])
        await run_steps(parts, "c", range(1, 13))
        request = "Now rename the `total` column to `amount_cents` in every migration, and keep the old name as a view."
        await send(parts, "c", [user(request)])
        for i in range(12):
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": "read", "arguments": f'{{"n": {i}}}'},
            }
            await send(
                parts,
                "c",
                [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {
                        "role": "tool",
                        "tool_call_id": "call_0",
                        "content": f"migration {i}: " + "column line " * 30,
                    },
                ],
            )
        await compact(parts, "c")

        messages = render((await parts.store.snapshot("c")).history)
        assert sum(request in text_of(m) for m in messages) == 1
        assert sum(TASK in text_of(m) for m in messages) == 1
        assert provider_problems(messages) == []
