"""The prompt-cache rows of ``bench``: what a provider's cache serves of a long agent session's
calls, and what they cost, with this product's history beside a sliding window's.

A generated agent session (``agent_data.agent_turn``: requests naming artifacts, two tool
calls with outputs of a few KB, a reply) is replayed offline through the worker's budget and
pipeline (``replay.simulate``, extractive summaries), one call per turn, and the same turns
through the peers' simple strategies (``replay.cache``), priced at Anthropic's and OpenAI's
prices. No broker or Redis: the figures are the history's, not the infrastructure's.

Beside them, the same session summarized by a model (the fake OpenAI-compatible server of
``testing``, through LiteLLM's real request path) asked for checked items and for Markdown: an item
that did not change keeps its bytes across compactions and folds, so the cached prefix can reach
further into the summary (summaries/schema.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_worker.bench.agent_data import agent_turn
from compaction_worker.bench.environment import BenchEnv
from compaction_worker.bench.report import Progress, Row
from compaction_worker.replay.cache import CacheFigures
from compaction_worker.replay.reader import Conversation
from compaction_worker.replay.simulate import Replay
from compaction_worker.settings import Settings
from compaction_worker.summaries.factory import configured_summarizers
from compaction_worker.testing import FakeLLMServer

WRITTEN_WINDOW = 32_000
"""The window of the model-written rows: small enough that the summaries are written, added to and
folded many times over a session, which is where items and Markdown differ."""
MODELS = ("claude-sonnet-4-20250514", "gpt-4o")
"""A cache read at a tenth of input with billed cache writes, and at half of input without."""


def session(steps: int) -> Conversation:
    """``steps`` agent steps after a system prompt, as one recorded conversation."""
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are the team's SRE agent. Never restart production without approval.",
        }
    ]
    for i in range(1, steps + 1):
        messages += agent_turn(i, salt="cache-")
    return Conversation("agent-session", tuple(messages))


async def cache_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """Per model: the cached share and the dollars, this product beside the sliding window."""
    steps, window = env.size(160, 40), 128_000 if env.scale >= 1 else 32_000
    settings = Settings()
    rows: list[Row] = []
    for model in MODELS:
        progress(f"cache: replaying {steps} agent steps on a {window:,}-token window, {model}")
        replay = Replay(
            session(steps), settings, configured_summarizers(settings), model=model, context_window=window
        )
        report = await replay.run()
        rows += _rows(model, window, steps, report.cache)
    rows += await _written_rows(steps, WRITTEN_WINDOW, progress)
    return rows


async def _written_rows(steps: int, window: int, progress: Progress) -> list[Row]:
    """The share the cache serves when a model writes the summaries: checked items beside Markdown."""
    model = MODELS[1]
    shares: dict[str, CacheFigures] = {}
    with FakeLLMServer() as server:
        for output in ("schema", "markdown"):
            progress(f"cache: {steps} agent steps summarized by a model asked for {output}")
            settings = Settings.model_validate(
                {
                    "summarizer": {
                        "model": "openai/fake",
                        "api_base": server.url,
                        "api_key": "fake",
                        "output": output,
                    }
                }
            )
            replay = Replay(
                session(steps), settings, configured_summarizers(settings), model=model, context_window=window
            )
            report = await replay.run()
            shares[output] = next(f for f in report.cache if f.strategy == "compaction-worker")
    items, markdown = shares["schema"], shares["markdown"]
    return [
        Row(
            f"prompt cache: share served, model-written summaries as checked items ({model})",
            items.cached_share,
            "",
            baseline=markdown.cached_share,
            baseline_name="as Markdown",
            note=f"{steps} agent steps, {window // 1000}K window, the fake model; cache breaks per 100 turns "
            f"{items.breaks_per_100_turns:.1f} (Markdown {markdown.breaks_per_100_turns:.1f})",
        )
    ]


def _rows(model: str, window: int, steps: int, cache: Sequence[CacheFigures]) -> list[Row]:
    by = {f.strategy: f for f in cache}
    ours, sliding, everything = by["compaction-worker"], by["sliding window"], by["summarize everything"]
    where = f"{steps} agent steps, {window // 1000}K window, {model}"
    rows = [
        Row(
            f"prompt cache: share of prompt tokens served ({model})",
            ours.cached_share,
            "",
            baseline=sliding.cached_share,
            baseline_name="sliding window",
            note=f"{where}; {ours.breaks_per_100_turns:.1f} cache breaks per 100 turns "
            f"(sliding window {sliding.breaks_per_100_turns:.1f})",
        )
    ]
    if ours.dollars is not None and sliding.dollars is not None and everything.dollars is not None:
        rows.append(
            Row(
                f"prompt cache: dollars per session ({model})",
                ours.dollars.total,
                "$",
                baseline=sliding.dollars.total,
                baseline_name="sliding window",
                note=f"{where}; summarize-everything {everything.dollars.total:.2f}, "
                f"no compaction {by['none'].dollars.total if by['none'].dollars else 0:.2f} (over the window)",
            )
        )
    return rows
