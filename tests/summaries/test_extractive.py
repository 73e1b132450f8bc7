"""The extractive summary: sections, content, budget, and validity for any span."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_worker.contracts.events import LlmUsage
from compaction_worker.summaries.contract import SummarizerError, validate_summary
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.prompts import SECTIONS
from tests.summaries.helpers import count, request


class TestExtractive:
    """The deterministic summary: sections, content, budget."""

    async def test_sections_and_content(self) -> None:
        """Every heading in order, each filled from the right part of the span."""
        result = await ExtractiveSummarizer(count).summarize(request())
        text = result.text
        positions = [text.index(f"## {s}") for s in SECTIONS]
        assert positions == sorted(positions)
        sections = dict(zip(SECTIONS, re.split(r"^## .*$", text, flags=re.MULTILINE)[1:], strict=True))
        assert "Add a /health endpoint to src/api/app.py." in sections["Goals and constraints"]
        assert "because it already has a router" in sections["Decisions and reasons"]
        assert "- path: src/api/app.py" in sections["Artifacts and paths"]
        assert "- cmd: pytest -q tests/test_app.py" in sections["Artifacts and paths"]
        assert "run: FAILED tests/test_app.py::test_health" in sections["Facts learned from tools"]
        assert (
            "- error: FAILED tests/test_app.py::test_health - AssertionError: 404 != 200"
            in sections["Errors"]
        )
        assert "The test fails with 404 because the route is missing." in sections["Current state"]
        assert "Now also document it in docs/api.md please." in sections["Next steps"]
        assert result.model == "extractive"
        assert result.usage == LlmUsage()
        assert result.tokens == count(text)

    async def test_deterministic(self) -> None:
        """The same span always gives the same summary."""
        first = await ExtractiveSummarizer(count).summarize(request())
        second = await ExtractiveSummarizer(count).summarize(request())
        assert first == second

    async def test_budget_drops_least_important_lines_first(self) -> None:
        """Under a tight budget the latest request stays and the tool facts go."""
        full = ExtractiveSummarizer(count).render(request())
        result = await ExtractiveSummarizer(count).summarize(request(max_summary_tokens=60))
        assert count(full) > 60
        assert result.tokens <= 60
        assert "Now also document it in docs/api.md please." in result.text
        assert "run: FAILED" not in result.text

    async def test_replaced_tokens_bound_the_summary(self) -> None:
        """A summary is always strictly smaller than what it replaces."""
        result = await ExtractiveSummarizer(count).summarize(request(replaced_tokens=70))
        assert result.tokens < 70

    async def test_tiny_budget_keeps_the_latest_request_and_no_empty_heading(self) -> None:
        """Under a tiny budget the most important lines stay; a heading with nothing under it goes."""
        result = await ExtractiveSummarizer(count).summarize(request(max_summary_tokens=32))
        assert "- User's latest request: Now also document it in docs/api.md please." in result.text
        lines = result.text.splitlines()
        assert all(not a.startswith("##") or not b.startswith("##") for a, b in itertools.pairwise(lines))
        assert not lines[-1].startswith("##")

    async def test_previous_summaries_are_folded_in(self) -> None:
        """Lines of earlier summaries land under the section of the same heading."""
        earlier = "## Decisions and reasons\n- Chose Postgres 16 for JSONB.\n## Errors\n- none"
        result = await ExtractiveSummarizer(count).summarize(request(previous_summaries=[earlier]))
        decisions = result.text.split("## Decisions and reasons")[1].split("## Artifacts")[0]
        assert "- Chose Postgres 16 for JSONB." in decisions

    async def test_items_of_the_chunk_ledger_are_not_repeated(self) -> None:
        """What the chunk's ledger keeps verbatim gets no line; the room goes to other artifacts."""
        ledger = ["path: src/api/app.py", "cmd: pytest -q tests/test_app.py"]
        result = await ExtractiveSummarizer(count).summarize(request(ledger=ledger))
        artifacts = result.text.split("## Artifacts and paths")[1].split("## ")[0]
        assert "- path: src/api/app.py" not in artifacts
        assert "- cmd: pytest -q tests/test_app.py" not in artifacts
        assert "- path: docs/api.md" in artifacts
        assert "- error: FAILED tests/test_app.py::test_health" in result.text

    async def test_tool_facts_skip_shell_echoes_and_repeats(self) -> None:
        """A command's output is its first line after the echo and its outcome, listed once."""
        call: dict[str, Any] = {
            "id": "c1",
            "type": "function",
            "function": {"name": "run", "arguments": "{}"},
        }
        output = "$ make test\ncollected 12 items\nlots of progress\n12 passed in 0.3s"
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Run the tests twice, please."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": output},
            {"role": "assistant", "content": None, "tool_calls": [{**call, "id": "c2"}]},
            {"role": "tool", "tool_call_id": "c2", "content": output},
            {"role": "assistant", "content": "Both runs passed."},
        ]
        text = (await ExtractiveSummarizer(count).summarize(request(messages))).text
        facts = text.split("## Facts learned from tools")[1].split("## ")[0]
        assert facts.strip() == "- run: collected 12 items … 12 passed in 0.3s"

    async def test_tool_facts_name_each_call_by_position(self) -> None:
        """Parallel calls sharing an id (as some providers send them): each result under its own tool."""
        calls = [
            {"id": "call_0", "type": "function", "function": {"name": name, "arguments": "{}"}}
            for name in ("read_file", "grep")
        ]
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Find where the total is computed."},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_0", "content": "def total(order): ..."},
            {"role": "tool", "tool_call_id": "call_0", "content": "src/orders.py:12: total("},
            {"role": "assistant", "content": "It is in src/orders.py."},
        ]
        text = (await ExtractiveSummarizer(count).summarize(request(messages))).text
        assert "- read_file: def total(order): ..." in text
        assert "- grep: src/orders.py:12: total(" in text

    async def test_no_text_is_an_error(self) -> None:
        """A span without any text cannot be summarized."""
        with pytest.raises(SummarizerError, match="nothing to summarize"):
            await ExtractiveSummarizer(count).summarize(request([{"role": "user", "content": "  "}]))


_WORDS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=200)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contents=st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "tool"]), _WORDS), min_size=1, max_size=8
    ),
    budget=st.integers(min_value=32, max_value=400),
)
async def test_extractive_summary_is_always_valid(contents: list[tuple[str, str]], budget: int) -> None:
    """Any span with some text gets a valid summary within the budget."""
    messages = [
        {"role": role, "content": text, "tool_call_id": "c"}
        if role == "tool"
        else {"role": role, "content": text}
        for role, text in contents
    ]
    if not any(text.strip() for _, text in contents):
        return
    req = request(messages, max_summary_tokens=budget, replaced_tokens=10_000)
    result = await ExtractiveSummarizer(count).summarize(req)
    validate_summary(result.text, result.tokens, req)
    assert result.tokens <= budget
