"""The recall rows of ``bench``: p50/p99 of ``Client.recall`` on a 1M-token conversation compacted once.

Two figures, because recall has two costs: a query against the index kept in process (the
common case: an agent's recalls between two compactions) and the first query after a
compaction, which reads the transcript's compacted part in pages, cuts it into passages
and builds the BM25 index (recall/search.py). The conversation is stored directly and
compacted by the worker's own compactor (extractive summaries), so that what the history
no longer carries is what a real compaction leaves out.
"""

from __future__ import annotations

import time

from compaction_worker.bench.agent_data import fill, label
from compaction_worker.bench.costs import offline_components
from compaction_worker.bench.environment import BenchEnv, BenchError
from compaction_worker.bench.report import Progress, Row, quantile
from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import Outcome, Trigger
from compaction_worker.runtime.pool import run_job

MODEL = "azure/gpt-4o"
"""A 128K window: one compaction leaves ~50K tokens in the history and ~950K out of it."""


def queries(turns: int) -> list[str]:
    """What an agent looks back for in agent_data.py's conversations: errors, files, incidents, commits."""
    out: list[str] = []
    for i in range(1, turns + 1, max(1, turns // 50)):
        out += [
            f"ECONNREFUSED 10.0.{i % 250}.7:5012",
            f"handler_{i % 11}.py retries",
            f"incidents {1000 + i}",
            f"worker-{i % 7} timing out acme-logs-{i % 5}",
        ]
    return out


async def recall_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """Recall latency (p50, p99) with the index cached and on the first query after a compaction."""
    size = env.size(1_000_000, 20_000)
    parts = offline_components(env.redis, env.unique("recall"))
    cid = "recall"
    progress(f"recall: storing {size:,} tokens")
    await fill(parts, cid, size, MODEL, counter_for(MODEL, parts.settings.budget))
    await parts.jobs.schedule(cid, Trigger.MANUAL)
    progress("recall: compacting")
    done = await run_job(parts.jobs, parts.compactor, cid)
    if done is None or done.outcome is not Outcome.COMPACTED:
        raise BenchError(f"recall: the conversation did not compact: {done}")
    recall = parts.recall
    asked = queries((await parts.store.meta(cid)).last_seq)
    cold: list[float] = []
    searched = 0
    for run in range(max(3, 3 * env.repeat)):
        progress(f"recall: building the index, run {run + 1}")
        recall.forget(cid)
        started = time.perf_counter()
        result = await recall.search(cid, asked[run % len(asked)])
        cold.append((time.perf_counter() - started) * 1000)
        searched = result.messages
    warm: list[float] = []
    progress(f"recall: {len(asked)} queries on the cached index")
    for _ in range(env.repeat):
        for query in asked:
            started = time.perf_counter()
            await recall.search(cid, query)
            warm.append((time.perf_counter() - started) * 1000)
    what = f"{label(size)}-token conversation, {searched:,} messages compacted away"
    rows = []
    for name, values, target in (("index cached", warm, 50.0), ("first after a compaction", cold, 3000.0)):
        note = f"{what}; {len(values)} queries"
        rows.append(Row(f"recall p50, {name} ({label(size)} tokens)", quantile(values, 0.5), "ms", note=note))
        rows.append(
            Row(f"recall p99, {name} ({label(size)} tokens)", quantile(values, 0.99), "ms", target=target)
        )
    return rows
