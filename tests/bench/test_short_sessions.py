"""The short-session benchmark's yardstick: its sessions, its scoring and the simple methods' budgets."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest
from click.testing import CliRunner

from compaction_worker.bench import short_standing
from compaction_worker.bench.canaries import FILLER, KINDS, Said
from compaction_worker.bench.carriers import (
    Checklist,
    Message,
    SlidingWindow,
    SummaryTail,
    content_words,
    looks_needed,
)
from compaction_worker.bench.short_sessions import PER_KIND, TOKENS, found, marked_only, says, session
from compaction_worker.budget.tokens import counter_for
from compaction_worker.cli import main
from compaction_worker.contracts.history import Entry, text_of
from compaction_worker.settings import BudgetSettings

COUNTER = counter_for(short_standing.MODEL, BudgetSettings())
SEEDS = (7, 8, 9, 10, 11, 12)


def _text(entries: Sequence[Entry]) -> str:
    return "\n\n".join(text_of(e.message) for e in entries)


def _occurrences(value: str, text: str) -> int:
    return len(re.findall(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, re.IGNORECASE))


def test_a_value_is_said_only_as_a_whole() -> None:
    """ "eu-west-1" is not in "eu-west-12", nor "5%" in "65%"; case does not matter."""
    assert says("eu-west-1", "Data stays in EU-WEST-1.")
    assert not says("eu-west-1", "Data stays in eu-west-12.")
    assert not says("5%", "Shadow traffic at 65%.")


def test_a_seed_makes_the_same_session_and_another_seed_another() -> None:
    """Deterministic per seed: the same messages, items and token count; a different seed differs."""
    a, b, c = session(7, COUNTER), session(7, COUNTER), session(8, COUNTER)
    assert [e.message for e in a.entries + a.more] == [e.message for e in b.entries + b.more]
    assert [(i.kind, i.said, i.change, i.changed_in) for i in a.items] == [
        (i.kind, i.said, i.change, i.changed_in) for i in b.items
    ]
    assert a.tokens == b.tokens
    assert [e.message for e in a.entries] != [e.message for e in c.entries]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_session_is_short_and_says_every_canary_once(seed: int) -> None:
    """~2,200 tokens (every message, counter.message); 4 items of each kind; each canary said by its
    sentence alone (no remark, no other item says it); 3-5 changed, one of them in the added turns."""
    s = session(seed, COUNTER)
    low, high = TOKENS
    assert low <= s.tokens <= high
    assert s.tokens == sum(COUNTER.message(e.message) for e in s.entries)
    assert sorted(i.kind for i in s.items) == sorted(KINDS * PER_KIND)
    said, more = _text(s.entries), _text(s.more)
    for item in s.items:
        assert found(item.said, said), item.said
        assert _occurrences(item.said.canary, said + more) == 1, item.said
        if item.change is not None and item.changed_in is not None:
            where, elsewhere = (said, more) if item.changed_in == 0 else (more, said)
            assert found(item.change, where)
            assert _occurrences(item.change.canary, elsewhere) == 0
    assert found(s.task, said)
    changed = [i for i in s.items if i.changed_in is not None]
    assert 3 <= len(changed) <= 5
    assert [i.changed_in for i in changed].count(1) == 1
    first = text_of(s.entries[0].message)
    assert (first in FILLER) == s.first_is_remark
    assert first == s.task.text or s.first_is_remark


def test_some_sessions_open_with_a_remark_and_some_with_the_task() -> None:
    """A product must not take the opening remark for the task: both openings occur."""
    assert {session(seed, COUNTER).first_is_remark for seed in SEEDS} == {True, False}


@pytest.mark.parametrize("share", short_standing.BUDGETS)
def test_the_simple_methods_fit_the_budget_in_every_round(share: float) -> None:
    """Each carrier's output, carried forward over five rounds, is at or under the budget."""
    s = session(7, COUNTER)
    budget = int(share * s.tokens)
    for carrier in (
        Checklist(COUNTER),
        Checklist(COUNTER, updates=True),
        SummaryTail(COUNTER),
        SlidingWindow(COUNTER),
    ):
        carried: list[Message] = []
        for added in (s.entries, s.more, [], [], []):
            carried = carrier.carry(carried, [e.message for e in added], budget)
            assert carried, carrier.name
            assert COUNTER.messages(carried) <= budget, carrier.name


def test_the_checklist_keeps_instructions_and_facts_and_the_updating_one_replaces_them() -> None:
    """A plain heuristic: a digit, a name or an instruction word; a question or a remark is left out.
    With updates, a later sentence sharing most content words replaces the earlier line."""
    assert looks_needed("Customer data stays in eu-west-1.")
    assert looks_needed("Never force-push to main.")
    assert not looks_needed("Can you check the consumer lag?")
    # A remark with "only" and a capitalized word in it is kept too: the heuristic's cost, as a user's would be.
    assert looks_needed("Cache invalidation is event-driven; the TTL is only a backstop.")
    assert not looks_needed("Backpressure kicks in when the queue gets deep.")
    assert content_words("Actually, make the window 60 minutes.") == {"window", "minutes"}
    said = [
        {"role": "user", "content": "Hard constraint: the maintenance window is 45 minutes."},
        {"role": "assistant", "content": "Noted."},
        {
            "role": "user",
            "content": "Backpressure kicks in when the queue gets deep. Actually, make the window 60 minutes.",
        },
    ]
    plain = Checklist(COUNTER).carry([], said, 1_000)
    updating = Checklist(COUNTER, updates=True).carry([], said, 1_000)
    assert text_of(plain[0]).splitlines() == [
        "- Hard constraint: the maintenance window is 45 minutes.",
        "- Actually, make the window 60 minutes.",
    ]
    assert text_of(updating[0]).splitlines() == ["- Actually, make the window 60 minutes."]


def test_an_item_is_kept_when_one_sentence_holds_its_value_and_words() -> None:
    """The canary alone, or the canary with its words in another sentence, is not the item."""
    item = Said("Customer data stays in eu-west-1.", "eu-west-1", ("customer data",))
    assert found(item, "- [turn 3] Customer data stays in eu-west-1.")
    assert found(item, "Note. customer data: EU-WEST-1 only.")
    assert not found(item, "Regions: eu-west-1.")
    assert not found(item, "Customer data matters. The bucket is in eu-west-1.")
    assert not found(item, "Customer data stays in eu-west-12.")


def test_an_old_value_counts_as_resolved_only_where_it_is_marked() -> None:
    """Marked on its line, or under a heading saying it no longer holds (until a blank line);
    a verbatim message still saying it is not."""
    assert marked_only("45 minutes", "Window: 60 minutes.")
    assert marked_only("45 minutes", "- The window was 45 minutes (changed later).")
    under = "Constraints:\n- Window 60 minutes.\nNo longer current (superseded):\n- Window 45 minutes."
    assert marked_only("45 minutes", under)
    assert not marked_only("45 minutes", under + "\n\nHard constraint: the window is 45 minutes.")
    assert not marked_only("45 minutes", "Constraints:\n- Window 45 minutes.")


def test_the_command_prints_every_method_ranked_with_the_product_beside_them() -> None:
    """`quality standing --short --json`: one row per method and budget, ranks 1..6, outputs measured."""
    args = ["quality", "standing", "--short", "--seeds", "7", "--budgets", "0.3", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert sorted(r["method"] for r in rows) == sorted(short_standing.METHODS)
    assert sorted(r["rank"] for r in rows) == list(range(1, len(short_standing.METHODS) + 1))
    for row in rows:
        assert len(row["rounds"]) == short_standing.ROUNDS
        assert row["over"] == (row["used"] > 1.0)
        assert 0.0 <= row["items"] <= 1.0
        assert set(row["by_kind"]) == set(KINDS)
