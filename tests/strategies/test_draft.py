"""What every stage shares (strategies/draft.py): a chunk's span and what it keeps."""

from __future__ import annotations

from compaction_worker.contracts.history import Entry
from compaction_worker.strategies.draft import make_chunk

from .helpers import COUNTER


def entry(n: int, role: str = "user") -> Entry:
    return Entry(n=n, seq=n, message={"role": role, "content": f"message {n}"}, tokens=5)


class TestKept:
    """A chunk's ``kept`` names the entries inside its span that stayed: a fold never leaves a message
    neither kept nor covered (invariant 1)."""

    def test_a_fold_does_not_keep_what_another_folded_chunk_covered(self) -> None:
        """A chunk once kept message 25 (a user's word lifted after its span); a later chunk covered 25.
        Folding both, 25 is covered, not kept: it is no entry any more (the chaos test found it)."""
        early = make_chunk(
            "a", [entry(n) for n in range(2, 25)], (), model="m", stages=(), count=COUNTER.text
        )
        early = make_chunk(
            "a",
            [entry(n) for n in range(2, 25)],
            (),
            model="m",
            stages=(),
            count=COUNTER.text,
            kept=[entry(1), entry(25)],
        )
        later = make_chunk(
            "b", [entry(n) for n in range(25, 38)], (), model="m", stages=(), count=COUNTER.text
        )
        assert not early.covers(25)
        assert later.covers(25)
        fold = make_chunk(
            "c",
            [entry(n) for n in range(38, 49)],
            (early, later),
            model="m",
            stages=(),
            count=COUNTER.text,
            kept=[entry(1), entry(49)],
        )
        assert (fold.first_n, fold.last_n) == (2, 48)
        assert fold.covers(25)
        assert all(fold.covers(n) for n in range(2, 49))
        assert fold.kept == ()

    def test_an_entry_kept_inside_the_span_stays_kept_through_a_fold(self) -> None:
        older = make_chunk(
            "a",
            [entry(n) for n in range(2, 30) if n != 12],
            (),
            model="m",
            stages=(),
            count=COUNTER.text,
            kept=[entry(12)],
        )
        fold = make_chunk(
            "b", [entry(n) for n in range(30, 40)], (older,), model="m", stages=(), count=COUNTER.text
        )
        assert fold.kept == (12,)
        assert not fold.covers(12)
        assert all(fold.covers(n) for n in range(2, 40) if n != 12)
