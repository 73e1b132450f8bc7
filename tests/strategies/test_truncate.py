"""The sliding window: the first exchange kept, a marker, full coverage, pinned entries, savings."""

from __future__ import annotations

from compaction_worker.contracts.events import Outcome
from compaction_worker.contracts.history import EffectiveHistory, SummaryChunk, render
from compaction_worker.strategies import provider_problems
from compaction_worker.strategies.draft import Draft, StageContext
from compaction_worker.strategies.pipeline import compact
from compaction_worker.strategies.truncate import (
    TRUNCATION_MODEL,
    equal_shares,
    retain_summaries,
    sliding_window,
    trim_to_tokens,
    truncation_chunk,
)
from compaction_worker.testing import Chat

from .helpers import COUNTER, context, words
from .summarizers import Scripted

FIRST_USER = "Set up CI for repo acme/shop: run `make test` on every push to main, Python 3.12 only."
FIRST_REPLY = "I will add .github/workflows/ci.yml with one job; it runs make test on 3.12."
FILLER = words(40)


def conversation(turns: int = 12, start: int = 1) -> Chat:
    """The first exchange, then ``turns`` user/assistant pairs of filler (about 45 tokens each)."""
    c = Chat(start=start).user(FIRST_USER).assistant(FIRST_REPLY)
    for i in range(turns):
        c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
    return c


def window(draft: Draft, target: int = 500) -> tuple[Draft, StageContext, SummaryChunk, int]:
    """Run the sliding window; returns the new draft, the context, the marker and the saving."""
    ctx = context(window=10_000, target=target)
    out = sliding_window(draft, ctx)
    assert out.report is not None
    assert out.report.stage == "truncate"
    return out.draft, ctx, out.draft.chunks[0], out.report.tokens_saved


def coverage_problems(before: Draft, after: Draft) -> list[str]:
    """docs/design.md, invariant 1: every message is an entry or covered by a chunk, never both, never neither."""
    ordinals = {e.n for e in before.entries} | {
        n for c in before.chunks for n in range(c.first_n, c.last_n + 1) if c.covers(n)
    }
    entries = {e.n for e in after.entries}
    problems = []
    for n in sorted(ordinals):
        covered = any(c.covers(n) for c in after.chunks)
        if covered == (n in entries):
            problems.append(f"message {n}: {'both' if covered else 'neither'}")
    return problems


class TestFirstExchange:
    """Reference 004, stage 4: "always preserves the first user-assistant pair"."""

    def test_first_user_message_and_reply_are_quoted_verbatim(self) -> None:
        """References 004 and 002 (context collapse keeps the first group): the first user message and the first reply survive, word for word."""
        _, _, marker, _ = window(conversation().draft())
        assert marker.model == TRUNCATION_MODEL
        assert f"First user message:\n{FIRST_USER}\n" in marker.text
        assert f"First assistant reply:\n{FIRST_REPLY}\n" in marker.text
        assert marker.covers(1)
        assert marker.covers(2)

    def test_reply_is_the_first_assistant_text_of_the_exchange(self) -> None:
        """A tool call before the reply is skipped: the quoted reply is the first with text."""
        c = Chat().user(FIRST_USER)
        c.tool("call_1", "read_file", {"path": "Makefile"}, "test:\n\tpytest -q")
        c.assistant(FIRST_REPLY)
        for i in range(12):
            c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
        _, _, marker, _ = window(c.draft())
        assert f"First assistant reply:\n{FIRST_REPLY}\n" in marker.text
        assert "pytest -q" not in marker.text

    def test_huge_first_message_is_trimmed_with_a_notice(self) -> None:
        """Reference 004 (text cut to a token budget): a huge first message keeps a verbatim prefix, within its budget, and says how much is cut."""
        huge = "Please review this log: " + words(5_000, "log")
        c = Chat().user(huge).assistant(FIRST_REPLY)
        for i in range(12):
            c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
        _, ctx, marker, _ = window(c.draft(), target=1_000)
        quoted = marker.text.split("First user message:\n")[1].split("\n\nFirst assistant reply:")[0]
        prefix, notice = quoted.rsplit("\n", 1)
        assert huge.startswith(prefix)
        assert len(prefix) > 100
        assert (
            notice == f"[... {len(huge) - len(prefix)} more characters of this message are in the transcript]"
        )
        room = ctx.limits.target - ctx.overhead
        assert COUNTER.text(quoted) <= room // 8

    def test_trim_keeps_short_text_whole(self) -> None:
        """Text within the budget is returned unchanged, without a notice."""
        assert trim_to_tokens(FIRST_USER, 100, COUNTER.text) == FIRST_USER

    def test_earlier_chunk_keeps_the_start(self) -> None:
        """When the start is inside an earlier chunk, that chunk's text is what the marker keeps."""
        start = SummaryChunk(
            "c1", "## Goals\n- CI for acme/shop on 3.12", 1, 4, 1, 4, 12, "2024-01-01T00:00:00+00:00", "m"
        )
        c = Chat(start=5)
        for i in range(12):
            c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
        after, _, marker, _ = window(c.draft((start,)))
        assert "[summary of turns 1-4]\n## Goals\n- CI for acme/shop on 3.12" in marker.text
        assert "as earlier compactions summarized it" in marker.text
        assert after.chunks == (marker,)
        removed = marker.last_n - 4
        assert f"[{removed} later messages were removed here without a summary" in marker.text
        assert "shortened" not in marker.text

    def test_first_exchange_kept_as_entries_is_not_quoted(self) -> None:
        """A pinned first message is verbatim already: only what the marker covers is quoted."""
        c = Chat().add({"role": "user", "content": FIRST_USER, "pinned": True}).assistant(FIRST_REPLY)
        for i in range(12):
            c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
        after, _, marker, _ = window(c.draft())
        assert after.entries[0].n == 1
        assert "First user message" not in marker.text
        assert f"First assistant reply:\n{FIRST_REPLY}" in marker.text


def summaries(*sizes: int, artifacts: tuple[tuple[str, ...], ...] = ()) -> tuple[SummaryChunk, ...]:
    """Chunks of ``sizes`` words standing for ten messages each; chunk ``i``'s words are ``s{i}_*``."""
    return tuple(
        SummaryChunk(
            f"c{i}",
            f"GOAL{i} " + words(size - 1, f"s{i}_"),
            10 * i + 1,
            10 * i + 10,
            10 * i + 1,
            10 * i + 10,
            size + 6,
            "2024-01-01T00:00:00+00:00",
            "m",
            artifacts=artifacts[i] if i < len(artifacts) else (),
        )
        for i, size in enumerate(sizes)
    )


def after_summaries(chunks: tuple[SummaryChunk, ...], turns: int = 12) -> Draft:
    """The chunks, then ``turns`` filler exchanges."""
    c = Chat(start=chunks[-1].last_n + 1)
    for i in range(turns):
        c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
    return c.draft(chunks)


class TestEarlierSummaries:
    """Issue 9: the window keeps what fits of every earlier summary and says what it changed."""

    def test_every_summary_keeps_its_opening_within_the_budget(self) -> None:
        """Three long summaries over the budget: each keeps its start, each is marked shortened."""
        chunks = summaries(150, 150, 150)
        after, ctx, marker, _ = window(after_summaries(chunks), target=1_200)
        for i in range(3):
            assert f"[summary of turns {10 * i + 1}-{10 * i + 10}, shortened]\nGOAL{i} s{i}_0" in marker.text
        assert "3 of the earlier summaries above were shortened to fit." in marker.text
        assert "no summary" not in marker.text
        assert ctx.fits(after)
        kept = marker.text.split("summarized it:\n\n")[1].rsplit("\n\n[", 1)[0]
        assert (
            (ctx.limits.target - ctx.overhead) // 8
            < COUNTER.text(kept)
            <= (ctx.limits.target - ctx.overhead) // 4
        )

    def test_a_short_summary_stays_whole_and_passes_on_its_share(self) -> None:
        """Equal shares: the short summary is kept whole; the long ones split what it leaves."""
        chunks = summaries(150, 10, 150)
        retained = retain_summaries(chunks, 200, COUNTER.text)
        assert f"[summary of turns 11-20]\n{chunks[1].text}" in retained.text
        assert retained.kept == chunks
        assert retained.shortened == 2
        assert COUNTER.text(retained.text) <= 200
        first, _, last = retained.text.split("\n\n")
        assert abs(COUNTER.text(first) - COUNTER.text(last)) <= 2

    def test_summaries_that_do_not_fit_are_named_as_left_out(self) -> None:
        """With no room for any summary text, the marker says which summaries it left out."""
        chunks = summaries(60, 60)
        head = after_summaries(chunks, turns=2).entries[:2]
        marker = truncation_chunk(head, chunks, COUNTER.text, summary_tokens=0)
        assert marker.text == (
            "[2 earlier messages were removed here without a summary, to keep the conversation within "
            "its token budget. 2 earlier summaries (of 20 messages, within turns 1-20) did not fit and "
            "are left out. The original messages are preserved in the transcript.]"
        )

    def test_when_shares_are_too_small_the_first_and_newest_stay(self) -> None:
        """Five summaries, room for two: the first (the goals) and the newest are kept."""
        chunks = summaries(100, 100, 100, 100, 100)
        retained = retain_summaries(chunks, 60, COUNTER.text)
        assert [c.id for c in retained.kept] == ["c0", "c4"]
        assert [c.id for c in retained.dropped] == ["c1", "c2", "c3"]
        marker = truncation_chunk((), chunks, COUNTER.text, summary_tokens=60)
        assert "3 earlier summaries (of 30 messages, within turns 11-40) did not fit and are left out." in (
            marker.text
        )
        assert "2 of the earlier summaries above were shortened to fit." in marker.text

    def test_ledgers_of_earlier_summaries_are_carried(self) -> None:
        """The chunks' verbatim references stay in the marker's ledger, newest first when tight."""
        ledgers = (("path: src/old.py", "cmd: make old"), ("error: KeyError: 'order_id'",))
        chunks = summaries(150, 150, artifacts=ledgers)
        marker = truncation_chunk((), chunks, COUNTER.text, summary_tokens=300)
        assert set(marker.artifacts) == {*ledgers[0], *ledgers[1]}
        assert "- error: KeyError: 'order_id'" in marker.render_text()
        tight = truncation_chunk((), chunks, COUNTER.text, summary_tokens=12)
        assert tight.artifacts == ("error: KeyError: 'order_id'",)
        assert "2 verbatim references of theirs did not fit." in tight.text

    def test_equal_shares(self) -> None:
        """Max-min fair: small sizes whole, the rest split evenly, never over the budget."""
        assert equal_shares([10, 100, 100], 110) == [10, 50, 50]
        assert equal_shares([10, 20], 100) == [10, 20]
        assert equal_shares([30, 30, 30], 10) == [3, 3, 4]
        assert equal_shares([], 10) == []

    async def test_pipeline_keeps_every_summary_when_the_summarizer_fails(self) -> None:
        """Through the pipeline: a failed summary falls back to a window that keeps both summaries."""
        chunks = summaries(40, 40)
        draft = after_summaries(chunks)
        history = EffectiveHistory(chunks, draft.entries)
        ctx = context(window=10_000, target=700)
        result = await compact(history, ctx.limits, [Scripted(fail=True)], COUNTER)
        assert result.stages == ("truncate",)
        (marker,) = result.draft.chunks
        assert chunks[0].text in marker.text
        assert chunks[1].text in marker.text
        assert "no summary could be produced" not in marker.text


class TestMarker:
    """Reference 004: a marker says what was removed; the originals stay in the transcript."""

    def test_marker_counts_what_it_removed_and_points_to_the_transcript(self) -> None:
        """References 004 and 002: the notice counts the covered messages not quoted, and names the transcript."""
        after, _, marker, _ = window(conversation().draft())
        covered = [n for n in range(1, 27) if marker.covers(n)]
        assert f"[{len(covered) - 2} later messages were removed here" in marker.text
        assert "The original messages are preserved in the transcript.]" in marker.text
        assert marker.text.rstrip().endswith("]")
        assert after.entries[0].n == covered[-1] + 1

    def test_marker_alone_when_quoting_would_not_fit(self) -> None:
        """When quotes would keep the target out of reach, the marker is the notice alone."""
        big = {"role": "user", "content": words(300, "p"), "pinned": True}
        c = conversation(turns=4).add(big).assistant("ok")
        draft = c.draft()
        plain = truncation_chunk(
            [e for e in draft.entries if e.n < 11], (), COUNTER.text, kept=[draft.entries[10]], quote_tokens=0
        )
        pinned = draft.entries[10].tokens
        target = 42 + pinned + plain.tokens + COUNTER.message({"role": "assistant", "content": "ok"}) + 1
        after, ctx, marker, _ = window(draft, target=target)
        covered = sum(1 for e in draft.entries if marker.covers(e.n))
        assert "quoted verbatim" not in marker.text
        assert marker.text.startswith(f"[{covered} earlier messages were removed here")
        assert covered >= 10
        assert ctx.fits(after)


class TestCoverage:
    """docs/design.md, invariant 1: whatever the window drops, the marker covers."""

    def test_marker_covers_everything_it_replaced(self) -> None:
        """Reference 002 (only the API-facing view collapses): every message before the tail is covered; the tail is not."""
        before = conversation().draft()
        after, _, marker, _ = window(before)
        assert coverage_problems(before, after) == []
        assert (marker.first_n, marker.first_seq) == (1, 1)
        assert marker.last_n == after.entries[0].n - 1

    def test_earlier_chunks_are_folded_into_the_marker(self) -> None:
        """Earlier chunks are replaced too, and what they covered stays covered."""
        chunks = (
            SummaryChunk("c1", "first", 1, 2, 1, 2, 5, "t", "m"),
            SummaryChunk("c2", "second", 3, 6, 3, 6, 5, "t", "m", kept=(5,)),
        )
        c = Chat(start=7)
        for i in range(12):
            c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
        pinned = Chat(start=5).add({"role": "user", "content": "keep this", "pinned": True})
        before = Draft(chunks, (*pinned.entries, *c.entries))
        after, _, marker, _ = window(before)
        assert coverage_problems(before, after) == []
        assert 5 in marker.kept
        assert after.entries[0].n == 5

    def test_a_message_no_longer_pinned_is_covered(self) -> None:
        """An entry an earlier chunk kept, no longer pinned, is covered by the marker, not lost."""
        chunks = (SummaryChunk("c1", "first", 1, 3, 1, 3, 5, "t", "m", kept=(2,)),)
        c = Chat(start=4)
        for i in range(12):
            c.user(f"u{i} {FILLER}").assistant(f"a{i} {FILLER}")
        before = Draft(chunks, (*Chat(start=2).assistant("was pinned").entries, *c.entries))
        after, _, marker, _ = window(before)
        assert marker.covers(2)
        assert coverage_problems(before, after) == []

    def test_pinned_entries_stay_entries(self) -> None:
        """A pinned message in the dropped range (with its tool pair) stays verbatim."""
        c = conversation(turns=3)
        c.tool("call_p", "read_file", {"path": "ci.yml"}, "jobs: test", pinned=True)
        for i in range(9):
            c.user(f"v{i} {FILLER}").assistant(f"b{i} {FILLER}")
        before = c.draft()
        after, _, marker, _ = window(before)
        pinned_ns = {e.n for e in before.entries if e.role == "tool" or e.message.get("tool_calls")}
        assert pinned_ns <= {e.n for e in after.entries}
        assert pinned_ns <= set(marker.kept)
        assert not any(marker.covers(n) for n in pinned_ns)
        assert coverage_problems(before, after) == []


class TestSavings:
    """The stage reports what it saved, in the pipeline's measure."""

    def test_report_matches_the_drafts(self) -> None:
        """tokens_saved is the drop in the draft's total; the detail counts the messages."""
        before = conversation().draft()
        after, ctx, marker, saved = window(before)
        assert saved == ctx.tokens(before) - ctx.tokens(after)
        assert saved > 0
        assert ctx.fits(after)
        out = sliding_window(before, ctx)
        assert out.report is not None
        covered = sum(1 for e in before.entries if marker.covers(e.n))
        assert out.report.detail == f"{covered} messages behind a marker"

    def test_nothing_to_drop_changes_nothing(self) -> None:
        """Reference 004 (no truncation when there is nothing to remove): a draft that is all tail is returned as it is, with no report."""
        draft = Chat().user("hi").assistant("hello").draft()
        out = sliding_window(draft, context(window=10_000, target=500))
        assert out.report is None
        assert out.draft == draft


async def test_pipeline_falls_back_to_the_window_with_the_first_exchange() -> None:
    """Reference 004: when every summarizer fails, the window keeps the first exchange, validly."""
    history = EffectiveHistory((), conversation().draft().entries)
    ctx = context(window=10_000, target=500)
    result = await compact(history, ctx.limits, [Scripted(fail=True)], COUNTER)
    assert result.outcome is Outcome.COMPACTED
    assert result.stages == ("truncate",)
    assert result.summarizer == TRUNCATION_MODEL
    rendered = render(history.with_parts(result.draft.chunks, result.draft.entries))
    assert provider_problems(rendered) == []
    assert FIRST_USER in rendered[0]["content"]
    assert FIRST_REPLY in rendered[0]["content"]


async def test_the_window_notes_a_tail_inside_the_latest_turn() -> None:
    """Board item 3: when even the window's tail cannot start at a user turn, the result says so."""
    c = conversation(turns=4).user("read all of these files")
    for i in range(10):
        c.tool(f"call_{i}", "read_file", {"path": f"f{i}.py"}, words(60, f"o{i}"))
    history = EffectiveHistory((), c.draft().entries)
    ctx = context(window=10_000, target=500)
    result = await compact(history, ctx.limits, [Scripted(fail=True)], COUNTER)
    assert result.stages[0] == "truncate"  # the files read in what it dropped may come back after it
    assert any(note.startswith("the latest turn alone") for note in result.notes), result.notes
