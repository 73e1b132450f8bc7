"""Summary chunks as the summary stage and the sliding window write them: span, level, ledger."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.strategies.draft import CountText


def make_chunk(
    text: str,
    covered: Sequence[Entry],
    folded: Sequence[SummaryChunk],
    *,
    model: str,
    stages: Sequence[str],
    count: CountText,
    artifacts: Sequence[str] = (),
    kept: Sequence[Entry] = (),
) -> SummaryChunk:
    """A summary chunk covering the folded chunks (if any) and the covered entries.

    ``kept`` are entries inside that span that stay verbatim (pinned); the chunk does not
    cover them, nor what the folded chunks had kept and it does not cover now. Its ``tokens``
    are those of its rendering: span header, summary and ledger.
    """
    firsts = [(c.first_n, c.first_seq) for c in folded] + [(e.n, e.seq) for e in covered]
    lasts = [(c.last_n, c.last_seq) for c in folded] + [(e.n, e.seq) for e in covered]
    first_n, first_seq = min(firsts)
    last_n, last_seq = max(lasts)
    chunk = SummaryChunk(
        id=uuid.uuid4().hex,
        text=text,
        first_seq=first_seq,
        last_seq=last_seq,
        first_n=first_n,
        last_n=last_n,
        tokens=0,
        created_at=datetime.now(UTC).isoformat(),
        model=model,
        stages=tuple(stages),
        level=(max(c.level for c in folded) + 1) if folded else 0,
        artifacts=tuple(artifacts),
        # What a folded chunk kept stays kept, unless it is covered now (no longer pinned).
        kept=tuple(
            sorted({e.n for e in kept} | ({n for c in folded for n in c.kept} - {e.n for e in covered}))
        ),
    )
    return replace(chunk, tokens=count(chunk.render_text()))


def chunk_frame(
    head: Sequence[Entry], folded: Sequence[SummaryChunk], ledger: Sequence[str], count: CountText
) -> tuple[int, int]:
    """Tokens of the rendered chunk around its summary: the span heading, and the ledger block."""
    bare = make_chunk("", head, folded, model="", stages=(), count=count)
    if not ledger:
        return bare.tokens, 0
    full = make_chunk("", head, folded, model="", stages=(), count=count, artifacts=ledger)
    return bare.tokens, full.tokens - bare.tokens
