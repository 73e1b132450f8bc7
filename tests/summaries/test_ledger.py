"""The verbatim artifact ledger each summary chunk carries."""

from __future__ import annotations

from dataclasses import replace

from compaction_worker.contracts.history import public_message, text_of
from compaction_worker.summaries.artifacts import KINDS, extract_artifacts
from compaction_worker.summaries.ledger import merge_ledgers
from compaction_worker.testing import Chat
from tests.strategies.helpers import COUNTER
from tests.strategies.summarizers import (
    FILLER,
    Fixed,
    Scripted,
    artifact_chat,
    ctx_with,
    old_chunk,
    summarize,
)


class TestLedger:
    """The verbatim artifact ledger each chunk carries (issue: LLM summaries drop them)."""

    async def test_new_chunk_keeps_its_span_artifacts_verbatim(self) -> None:
        """The ledger is extract_artifacts of exactly the summarized span, and it is rendered."""
        draft = artifact_chat().draft()
        ctx = ctx_with()
        out = await summarize(draft, ctx, [Scripted()])
        assert out.report is not None
        (chunk,) = out.draft.chunks
        head = [public_message(e.message) for e in draft.entries if chunk.covers(e.n)]
        assert chunk.artifacts == tuple(
            extract_artifacts(head, ctx.settings.artifact_budget_tokens, COUNTER.text)
        )
        assert "error: ValueError: order 4412 total is negative" in chunk.artifacts
        assert "cmd: pytest tests/test_orders.py -k total" in chunk.artifacts
        assert "path: src/orders/total.py" in chunk.artifacts
        assert "url: https://ci.example.com/builds/9001" in chunk.artifacts
        assert "id: 3f9a2c1d7e" in chunk.artifacts
        assert "- error: ValueError: order 4412 total is negative" in chunk.render_text()
        assert chunk.tokens == COUNTER.text(chunk.render_text())

    async def test_summary_and_ledger_read_the_originals_of_edited_entries(self) -> None:
        """A span whose tool output an earlier run cleared is summarized from the transcript's original."""
        original = "Traceback (most recent call last):\nKeyError: 'order_id'\nsee src/orders/total.py"
        chat = Chat().user("run the tests").tool("r", "run_command", {"command": "make test"}, original)
        cleared = "[Old tool result cleared: run_command, 40 tokens; the full output is preserved in the transcript]"
        chat.entries[-1] = replace(
            chat.entries[-1], message={**chat.entries[-1].message, "content": cleared}, edit="pruned"
        )
        for i in range(8):
            chat.user(f"filler {i} {FILLER}").assistant(f"reply {i} {FILLER}")
        pruned_n = chat.entries[2].n
        summarizer = Scripted()
        without = await summarize(chat.draft(), ctx_with(), [Scripted()])
        out = await summarize(
            chat.draft(),
            ctx_with(),
            [summarizer],
            originals={pruned_n: {**chat.entries[2].message, "content": original}},
        )
        assert without.report is not None
        assert out.report is not None
        assert "error: KeyError: 'order_id'" not in without.draft.chunks[0].artifacts
        assert "error: KeyError: 'order_id'" in out.draft.chunks[0].artifacts
        assert "path: src/orders/total.py" in out.draft.chunks[0].artifacts
        (request,) = summarizer.requests
        assert original in [m.get("content") for m in request.messages]

    async def test_the_ledger_keeps_every_identifier_the_room_allows(self) -> None:
        """Identifiers rank above the summary's narrative (strategies/allocation.py): the settings' budget
        is a floor, and with room every path is kept, far past it."""
        paths = [f"src/pkg/module_{i}.py" for i in range(30)]
        texts = tuple(f"Look at {p} and tell me what it does. {FILLER}" for p in paths)
        draft = artifact_chat(texts=(*texts, "KeyError: 'order_id'", "fine")).draft()
        settings = ctx_with().settings.model_copy(
            update={"artifact_budget_tokens": 30, "artifact_budget_fraction": 0}
        )
        out = await summarize(draft, replace(ctx_with(target=3_600), settings=settings), [Scripted(None)])
        assert out.report is not None
        ledger = out.draft.chunks[0].artifacts
        shown = "\n".join(
            [c.render_text() for c in out.draft.chunks] + [text_of(e.message) for e in out.draft.entries]
        )
        assert all(p in shown for p in paths)
        assert "error: KeyError: 'order_id'" in ledger
        assert COUNTER.text("\n".join(ledger)) > 30

    async def test_short_of_room_the_ledger_keeps_the_error_over_paths(self) -> None:
        """Many artifacts, little room: the ledger fits what the chunk may take and keeps the error first."""
        paths = " ".join(f"src/pkg/module_{i}.py" for i in range(200))
        texts = (f"Look at {paths}", "KeyError: 'order_id'", "fine")
        draft = artifact_chat(texts=texts).draft()
        ctx = ctx_with(target=900)
        out = await summarize(draft, ctx, [Scripted(None)])
        assert out.report is not None
        ledger = out.draft.chunks[0].artifacts
        assert ctx.fits(out.draft)
        assert ledger[0] == "error: KeyError: 'order_id'"
        assert 5 < len(ledger) < 200

    async def test_fold_merges_the_ledgers(self) -> None:
        """A fold keeps the folded chunks' items and the new span's, each once, by kind."""
        older = old_chunk(1, 1, 80, artifacts=("error: ImportError: no module named yaml", "path: old/a.py"))
        newer = old_chunk(2, 2, 80, artifacts=("path: src/orders/total.py", "cmd: make lint"))
        out = await summarize(artifact_chat(start=3).draft((older, newer)), ctx_with(), [Scripted()])
        assert out.report is not None
        (chunk,) = out.draft.chunks
        ledger = chunk.artifacts
        for item in (*older.artifacts, *newer.artifacts, "error: ValueError: order 4412 total is negative"):
            assert item in ledger
        assert len(ledger) == len(set(ledger))
        kinds = [item.split(":", 1)[0] for item in ledger]
        assert kinds == sorted(kinds, key=KINDS.index)

    async def test_the_ledger_takes_what_a_short_summary_leaves(self) -> None:
        """Issue 9: ledger items outrank prose; a short summary's unused share goes to the ledger.

        The chunk never outgrows the one a summary filling its whole cap would make.
        """
        paths = " ".join(f"src/pkg/module_{i}.py" for i in range(200))
        draft = artifact_chat(texts=(f"Look at {paths}", "KeyError: 'order_id'", "fine")).draft()
        ctx = replace(
            ctx_with(),
            settings=ctx_with().settings.model_copy(
                update={"artifact_budget_tokens": 30, "artifact_budget_fraction": 0}
            ),
        )
        short = await summarize(draft, ctx, [Scripted(5)])
        full = await summarize(draft, ctx, [Scripted(None)])
        assert short.report is not None
        assert full.report is not None
        ledger = short.draft.chunks[0].artifacts
        assert COUNTER.text("\n".join(ledger)) > 3 * 30
        assert ledger[0] == "error: KeyError: 'order_id'"
        assert short.draft.chunks[0].tokens <= full.draft.chunks[0].tokens

    async def test_a_span_of_artifacts_still_shrinks(self) -> None:
        """When every word is an artifact, the ledger keeps at most half of what the chunk replaces."""
        texts = tuple(" ".join(f"svc-{t}-{i}" for i in range(60)) for t in range(6))
        draft = artifact_chat(texts=texts).draft()
        out = await summarize(draft, ctx_with(), [Scripted(5)])
        assert out.report is not None
        (chunk,) = out.draft.chunks
        replaced = sum(e.tokens for e in draft.entries if chunk.covers(e.n))
        assert len(chunk.artifacts) > 30
        assert COUNTER.text("\n".join(chunk.artifacts)) <= replaced // 2

    async def test_items_the_summary_keeps_verbatim_take_no_room(self) -> None:
        """What the summary text already holds verbatim is not repeated in the ledger."""
        text = "Fixed src/orders/total.py after ValueError: order 4412 total is negative."
        out = await summarize(artifact_chat().draft(), ctx_with(), [Fixed(text)])
        assert out.report is not None
        ledger = out.draft.chunks[0].artifacts
        assert not [item for item in ledger if "total.py" in item or "4412" in item]
        assert "url: https://ci.example.com/builds/9001" in ledger
        assert "id: 3f9a2c1d7e" in ledger

    async def test_a_fold_keeps_what_its_summary_drops(self) -> None:
        """Issue 9: the facts and ledger items of folded chunks survive a summary that drops them."""
        older = old_chunk(
            1,
            1,
            80,
            text="The user capped memory at 512 MiB; the freeze starts on 2025-03-14.",
            artifacts=("path: old/a.py", "name: acme-orders-archive"),
        )
        newer = old_chunk(2, 2, 80, text="Nothing else.", artifacts=("cmd: make lint",))
        out = await summarize(
            artifact_chat(start=3).draft((older, newer)), ctx_with(), [Fixed("Work went on.")]
        )
        assert out.report is not None
        assert out.stages == ("summarize", "fold")
        (chunk,) = out.draft.chunks
        rendered = chunk.render_text()
        for kept in ("512 MiB", "2025-03-14", "old/a.py", "acme-orders-archive", "make lint", "4412"):
            assert kept in rendered

    def test_short_of_room_items_keep_their_cores_and_repeats_go(self) -> None:
        """Cores (the errno and address, the value) rather than sentences; contained items take no room."""
        error = "error: error: ECONNREFUSED 10.0.3.7:5012 while the payments service restarted after a deploy"
        items = [error, "host: 10.0.3.7:5012", "fact: set the memory limit to 512 MiB"]
        roomy = merge_ledgers([items], 1_000, COUNTER.text)
        assert roomy == (error, "fact: set the memory limit to 512 MiB")  # the host is in the error
        cores = "error: ECONNREFUSED 10.0.3.7:5012\nfact: 512 MiB"
        tight = merge_ledgers([items], COUNTER.text(cores) + 1, COUNTER.text)  # +1: a newline's estimate
        assert tight == ("error: ECONNREFUSED 10.0.3.7:5012", "fact: 512 MiB")

    def test_merge_prefers_recent_and_important_within_the_budget(self) -> None:
        """Rank is kind plus age: a recent error first, then a recent path over an old one."""
        newest = ["path: new.py", "error: E1: now"]
        oldest = ["path: old.py", "error: E0: before"]
        per_item = COUNTER.text("error: E1: now") + 1
        kept = merge_ledgers([newest, oldest], 3 * per_item, COUNTER.text)
        assert kept == ("error: E0: before", "error: E1: now", "path: new.py")
        assert merge_ledgers([newest, newest], 100, COUNTER.text) == ("error: E1: now", "path: new.py")
        assert merge_ledgers([newest], 0, COUNTER.text) == ()
