"""What a user's sentence says (summaries/sentences.py): its kind, whether it asks, whether it is filler."""

from __future__ import annotations

import pytest

from compaction_worker.summaries.sentences import (
    asks_for_work,
    classify,
    is_filler,
    says_nothing_new,
    sentences,
)


@pytest.mark.parametrize(
    ("sentence", "kind"),
    [
        ("Never execute shell commands without explicit approval.", "rule"),
        ("ALWAYS run the tests before you push.", "rule"),
        ("do not touch the billing tables", "rule"),
        ("From now on, reply in French.", "rule"),
        ("Spend at most $200 on the cloud bill.", "constraint"),
        ("The deadline is Friday.", "constraint"),
        ("Python 3.11 only, do not use 3.12 features.", "constraint"),
        ("No more than 3 retries per call.", "constraint"),
        ("I prefer terse answers.", "preference"),
        ("Please use metric units.", "preference"),
        ("We're migrating auth from sessions to JWT.", "goal"),
        ("The task is to cut p99 latency in half.", "goal"),
        ("We decided to use Postgres 16.", "decision"),
        ("Let's go with the blue-green rollout.", "decision"),
        ("Our team is called bluefin.", "fact"),
        ("The on-call number is 0151 123 4567.", "fact"),
        ("We sent 80738 messages last week.", "fact"),
    ],
)
def test_each_kind_is_read_from_the_words_the_user_uses(sentence: str, kind: str) -> None:
    assert classify(sentence) == kind


@pytest.mark.parametrize(
    "sentence",
    ["Can you look at the logs?", "Look at part 37 please", "ok", "Thanks, that works.", "x" * 500],
)
def test_questions_requests_chatter_and_pasted_prose_are_no_items(sentence: str) -> None:
    assert classify(sentence) is None


def test_code_blocks_tables_and_quotes_are_not_read() -> None:
    text = "Run this:\n```\n# never do this\nrm -rf /\n```\n| never | a table |\n> quoted line\nAlways ask first."
    assert sentences(text) == ["Run this:", "quoted line", "Always ask first."]


@pytest.mark.parametrize(
    ("sentence", "kind"),
    [
        ("The exporter never had proper load tests.", None),
        ("The exporter must have been copied from the reporting service at some point.", None),
        ("Cache invalidation is event-driven; the TTL is only a backstop.", None),
        ("Get Priya's sign-off before any change to the ledger schema.", "rule"),
        ("If the error rate spikes, flip EXPORTS_FREEZE_3 and stop everything.", "rule"),
        ("Safety rule: do not run migrations against prod-db-07 without a snapshot.", "rule"),
        ("Hard constraint: the maintenance window is 45 minutes.", "constraint"),
        ("Keep the cutover under 23 seconds of downtime.", "constraint"),
        ("We can't go over 50 requests per second against the Recurly API.", "constraint"),
        ("Timestamps in UTC with ISO 8601, please.", "preference"),
        ("Status: 4 of 85 tenants are migrated.", "goal"),
        ("Summaries go in #proj-invoicing, not in DMs.", "fact"),
        ("Switch timestamps to America/Sao_Paulo, please.", "fact"),
    ],
)
def test_directives_labels_and_limits_as_people_write_them(sentence: str, kind: str | None) -> None:
    """A rule is said as a directive; a description with "never" or "must" is none (issue 53)."""
    assert classify(sentence) == kind


def test_an_item_is_a_few_words_not_a_paragraph() -> None:
    assert classify("Keep the budget " + "and the plan " * 15 + "under 500 dollars.") is None


@pytest.mark.parametrize(
    "sentence",
    [
        "The webhook retries three times before dead-lettering.",
        "Acknowledged. Continuing with the plan.",
        "We moved offices last year, so some docs are outdated.",
    ],
)
def test_a_remark_that_names_nothing_is_filler(sentence: str) -> None:
    assert all(is_filler(s) for s in sentences(sentence))
    assert says_nothing_new(sentence)


@pytest.mark.parametrize(
    "sentence",
    [
        "Our billing vendor is Zuora, account 88213.",
        "Did the smoke test pass?",
        "Run the tests again, please.",
    ],
)
def test_what_names_or_asks_something_is_not(sentence: str) -> None:
    assert not says_nothing_new(sentence)


def test_a_task_asks_for_work_a_remark_does_not() -> None:
    assert asks_for_work("Please migrate the billing exports to the new queue.")
    assert asks_for_work("Today's job: port the billing exports, one exporter at a time.")
    assert not asks_for_work("The webhook retries three times before dead-lettering.")


def test_code_is_never_filler() -> None:
    assert not says_nothing_new("Submitting it now.\n```\nsubmit 'HTB{x}'\n```")
