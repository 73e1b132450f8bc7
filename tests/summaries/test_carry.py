"""Distinctive terms found by their shape, and carried with their context within a budget (summaries/carry.py)."""

from __future__ import annotations

import pytest

from compaction_worker.summaries.carry import carry, distinctive_terms, is_distinctive, line_terms
from compaction_worker.testing import WordCounter

COUNT = WordCounter().text

ISSUE = (
    "TimeDelta serialization precision: in marshmallow 3.0.0rc8 `fields.TimeDelta(precision='milliseconds')` "
    "returns 344 for td = timedelta(milliseconds=345). See src/marshmallow/fields.py near line 1474. "
    "Ping bob@example.com or set LOG_LEVEL=debug on api-gateway.internal:8443 before Friday."
)


class TestDistinctive:
    @pytest.mark.parametrize(
        "word",
        [
            "v2",
            "3.11",
            "8080",
            "fields.py",
            "a/b",
            "KEY=value",
            "x@y.io",
            "snake_case",
            "checkout-v2",
            "TimeDelta",
            "camelCase",
            "HTTP",
            "deployment/web",
            "ghcr.io/acme/api:1.4",
        ],
    )
    def test_shapes_unlike_common_words(self, word: str) -> None:
        """Digits, inner punctuation or an inner capital make a term, whatever its kind."""
        assert is_distinctive(word)

    @pytest.mark.parametrize(
        "word", ["the", "Friday", "precision", "a", "well-", "well-known", "end-to-end", "and/or", "x" * 200]
    )
    def test_common_words_and_blobs_are_not(self, word: str) -> None:
        """Plain words, compounds of them, a lone letter or a 200-character blob: none is one.

        (A capitalised word is a term by its place in a sentence: see ``line_terms``.)"""
        assert not is_distinctive(word)

    def test_terms_in_order_once_with_code_spans_whole(self) -> None:
        """Surrounding punctuation is stripped; a code span counts whole besides its words."""
        terms = distinctive_terms(ISSUE)
        assert terms[0] == "fields.TimeDelta(precision='milliseconds')"
        for term in [
            "TimeDelta",
            "3.0.0rc8",
            "344",
            "src/marshmallow/fields.py",
            "1474",
            "bob@example.com",
            "LOG_LEVEL=debug",
            "api-gateway.internal:8443",
        ]:
            assert term in terms
        assert len(terms) == len(set(terms))
        assert "Friday" in terms  # a name mid-sentence
        assert "Ping" not in terms  # a sentence's first word


class TestCarry:
    def test_everything_fits_a_large_budget(self) -> None:
        """Each term is carried inside a phrase of the text, verbatim; nothing is dropped."""
        out = carry(ISSUE, 1_000, COUNT)
        assert set(out.carried) == set(distinctive_terms(ISSUE))
        assert out.dropped == ()
        squeezed = " ".join(ISSUE.split())
        assert all(phrase in squeezed for phrase in out.phrases)

    def test_a_small_budget_keeps_the_first_and_counts_the_rest(self) -> None:
        """What does not fit is returned as dropped: carried and dropped make up all the terms."""
        out = carry(ISSUE, 12, COUNT)
        assert out.carried
        assert out.dropped
        assert sum(COUNT(p) + 1 for p in out.phrases) <= 12
        assert set(out.carried) | set(out.dropped) == set(distinctive_terms(ISSUE))
        assert not set(out.carried) & set(out.dropped)

    def test_terms_said_elsewhere_are_skipped(self) -> None:
        """A term already kept verbatim (in a head or tail) is not repeated."""
        out = carry(ISSUE, 1_000, COUNT, skip=["TimeDelta", "344"])
        assert "TimeDelta" not in out.carried
        assert "344" not in out.carried + out.dropped

    def test_no_terms_no_phrases(self) -> None:
        assert carry("just some plain words here", 100, COUNT).phrases == ()


class TestLineTerms:
    def test_names_by_their_capitals_and_terms_by_their_shape(self) -> None:
        """Names mid-sentence or in runs of two, identifiers anywhere; a sentence's first word is no name."""
        line = "Alice Chen from Acme Corp wants it by Friday. We run Postgres 16 on db-7.internal:5432."
        assert [term for term, _ in line_terms(line)] == [
            "Alice Chen",
            "Acme Corp",
            "Friday",
            "Postgres 16",
            "db-7.internal:5432",
        ]

    def test_what_belongs_to_a_term_joins_it(self) -> None:
        """A phone number's groups, a date's day, a count's noun, a name given in lowercase: one term each."""
        line = (
            "Call 0412 555 0199 before March 14, we saw 80738 messages, and the team is called bluefin; "
            "the old one was known as kestrel. It took 345 ms."
        )
        assert [term for term, _ in line_terms(line)] == [
            "0412 555 0199",
            "March 14",
            "80738 messages",
            "bluefin",
            "kestrel",
            "345 ms",
        ]

    def test_each_term_comes_with_the_words_around_it(self) -> None:
        phrases = dict(line_terms("please mail the weekly report to ops@example.com before noon every day"))
        assert phrases["ops@example.com"] == "weekly report to ops@example.com before noon every"
