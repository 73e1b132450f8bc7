"""The standing state read from the user's words (summaries/standing.py): kinds, changes, the budget."""

from __future__ import annotations

from compaction_worker.summaries.standing import (
    STANDING_HEADER,
    SUPERSEDED_TITLE,
    Item,
    accepted,
    extract,
    merge,
    quoted,
    render,
)
from compaction_worker.testing import WordCounter

COUNT = WordCounter().text


def states(*said: tuple[int, str]) -> list[Item]:
    return merge([], [item for seq, text in said for item in extract(text, seq, seq)])


def test_a_later_value_of_the_same_subject_supersedes_the_earlier() -> None:
    items = states(
        (1, "Keep the budget cap at $500."),
        (2, "The deadline is Friday."),
        (3, "Use Fahrenheit for temperatures."),
        (4, "Raise the budget cap to $800."),
        (5, "Move the deadline to the 20th."),
        (6, "Actually, use Celsius for temperatures."),
    )
    assert {(i.text, i.superseded_by) for i in items} == {
        ("Keep the budget cap at $500.", 4),
        ("The deadline is Friday.", 5),
        ("Use Fahrenheit for temperatures.", 6),
        ("Raise the budget cap to $800.", None),
        ("Move the deadline to the 20th.", None),
        ("Actually, use Celsius for temperatures.", None),
    }


def test_items_about_other_subjects_stay_current() -> None:
    items = states(
        (1, "Please use metric units."),
        (2, "Never push to main."),
        (3, "Never deploy on Fridays."),
        (4, "Actually, use Celsius for temperatures."),
        (5, "Our team is called bluefin."),
        (6, "Our office is in Lyon."),
    )
    assert [i.superseded_by for i in items] == [None] * 6


def test_a_carried_state_and_the_messages_read_again_make_each_item_once() -> None:
    """Compacting again reads the same messages: nothing doubles, a carried supersession stays."""
    first = states((1, "Keep the cap at $500."), (2, "Raise the cap to $800."))
    again = merge(first, [*extract("Keep the cap at $500.", 1, 1), *extract("Raise the cap to $800.", 2, 2)])
    assert again == first
    assert Item.from_data(first[0].to_data()) == first[0]


def test_when_space_is_short_superseded_then_facts_go_first_and_rules_last() -> None:
    items = states(
        (1, "Keep the cap at $500."),
        (2, "Never run migrations without a backup."),
        (3, "Our team is called bluefin."),
        (4, "We decided to use Postgres 16."),
        (5, "Raise the cap to $800."),
    )
    whole = render(items, 10_000, COUNT)
    assert whole.dropped == ()
    assert whole.text.startswith(STANDING_HEADER)
    assert SUPERSEDED_TITLE in whole.text
    # Labels give way before items: one token less keeps every item, without the turn labels.
    labelled = render(items, COUNT(whole.text) - 1, COUNT)
    assert labelled.dropped == ()
    assert "[turn" not in labelled.text
    assert SUPERSEDED_TITLE in labelled.text
    bare = render(items, COUNT(_bare(items)), COUNT)
    assert bare.dropped == ()
    tight = render(items, COUNT(_bare(items)) - 1, COUNT)
    assert [i.text for i in tight.dropped] == ["Keep the cap at $500."]
    tighter = render(items, 16, COUNT)
    assert {i.kind for i in tighter.kept} == {"rule", "constraint"}
    assert COUNT(tighter.text) <= 16
    assert render(items, 3, COUNT).text == ""


def test_within_a_tier_the_costliest_item_goes_first() -> None:
    """Value per token: of two facts, the longer gives way, so that more items stay."""
    items = states(
        (1, "Our team is called bluefin."), (2, "The staging office in Porto has 14 desks on floor 3.")
    )
    one = render(items, COUNT(_bare(items)) - 1, COUNT)
    assert [i.text for i in one.kept] == ["Our team is called bluefin."]


def _bare(items: list[Item]) -> str:
    """The barest rendering of ``items``: the header and a line each (the superseded under their title)."""
    current = [f"- {i.text}" for i in items if i.current]
    old = [f"- {i.text}" for i in items if not i.current]
    return "\n".join([STANDING_HEADER, *current, *([SUPERSEDED_TITLE, *old] if old else [])])


class TestAccepted:
    """A decision the assistant proposed and the user's next message accepted (issue 33, item 1)."""

    def test_a_proposal_the_user_accepts_is_a_decision_in_the_assistants_words(self) -> None:
        proposal = "I compared both. I'll use Postgres 16 for the orders service. Want me to start?"
        for reply in ("ok", "Yes, go ahead.", "sounds good", "LGTM"):
            assert [i.text for i in accepted(proposal, reply, 3, 5)] == [
                "I'll use Postgres 16 for the orders service."
            ]
        assert accepted("I suggest we cap retries at 3.", "agreed", 1, 1)[0].kind == "decision"

    def test_a_reply_that_is_no_plain_yes_accepts_nothing(self) -> None:
        proposal = "I'll use Postgres 16 for the orders service."
        for reply in ("yes but use MySQL", "no", "what about MySQL?", "ok " + "and then " * 10 + "more"):
            assert accepted(proposal, reply, 3, 5) == []
        assert accepted("Here is the diff you asked for.", "ok", 3, 5) == []


class TestQuoted:
    """A summarizer's quotes of the user's standing sentences, checked against what the user wrote."""

    SAID = ((3, 5, "Hi. Write all dates as ISO 8601. Thanks."), (7, 9, "Never push on Fridays."))

    def test_a_quote_the_transcript_supports_is_an_item_of_its_message(self) -> None:
        summary = (
            "## Goals and constraints\n"
            '- [preference] "Write all dates as ISO 8601."\n'
            "- [rule] \u201cNever push on Fridays.\u201d\n"
            "- The user wants the report fixed.\n"
            "## Decisions and reasons\n- none"
        )
        items, rest = quoted(summary, self.SAID)
        assert [(i.kind, i.text, i.seq, i.n) for i in items] == [
            ("preference", "Write all dates as ISO 8601.", 3, 5),
            ("rule", "Never push on Fridays.", 7, 9),
        ]
        assert (
            rest
            == "## Goals and constraints\n- The user wants the report fixed.\n## Decisions and reasons\n- none"
        )

    def test_a_quote_no_message_holds_word_for_word_is_dropped(self) -> None:
        summary = '- [rule] "Never deploy without a review."\n- [fact] "Write all dates as ISO-8601."'
        items, rest = quoted(summary, self.SAID)
        assert items == []
        assert rest == ""
