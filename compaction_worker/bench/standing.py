"""Typed canaries: what the user set survives five compactions in a row, by kind, at tight budgets.

Run: compaction-worker quality standing [--seeds 7 8 9] [--windows 4096 ...] [--budgets 0.3 ...] [--json]
     compaction-worker quality standing --model openai/local --api-base http://127.0.0.1:8765/v1  (a real model)
     compaction-worker quality standing --short [--help]  (short sessions at absolute budgets, beside simple
     methods: bench/short_standing.py)

A generated conversation (seeded; each item drawn from several templates with random subjects
and values, so that nothing is tuned to one list) plants items of every kind in user turns —
rules, constraints, preferences, goals, decisions, facts — among requests, questions and long
assistant replies with tool calls, and changes some of them later ("actually, raise the cap to
..."). It is compacted five times in a row: after the conversation, after more turns, then three
times with no new turn (forced). The output is held to 10%, 20% and 30% of the conversation's
tokens, at 4K, 6K, 8K and 128K windows, with the extractive summarizer (every outage's fallback),
a lossy stand-in for a weak model (its summary says nothing the user said) and, with --model, a
real one. After each round the rendered effective history is searched for each current item's
sentence, verbatim; a changed item counts as resolved when its new sentence is there and its old
one is only under "No longer current". It prints survival by kind and round, the budget used
(tokens after / target) and how many summarized turns the summarizer read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compaction_worker import strategies
from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import STANDING, EffectiveHistory, render, text_of
from compaction_worker.retry import RetrySettings
from compaction_worker.settings import BudgetSettings, SummarizerSettings
from compaction_worker.summaries.contract import (
    InputTooLargeError,
    Summarizer,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
)
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.llm import LiteLLMSummarizer
from compaction_worker.summaries.standing import SUPERSEDED_TITLE
from compaction_worker.testing import Chat

MODEL = "gpt-4o-mini"
WINDOWS = (4_096, 6_144, 8_192, 128_000)
BUDGETS = (0.10, 0.20, 0.30)
ROUNDS = 5
KINDS = ("rule", "constraint", "preference", "goal", "decision", "fact")

_SUBJECTS = ["billing", "auth", "search", "payments", "reports", "the importer", "the mobile app", "checkout"]
_TOOLS = ["Postgres 16", "Redis 7", "Kafka", "SQLite", "FastAPI", "Celery", "gRPC", "GraphQL"]
_NAMES = ["bluefin", "Orca", "kestrel", "Marlin", "tern", "Heron", "puffin", "Osprey"]
_CITIES = ["Lyon", "Porto", "Tartu", "Gdansk", "Leipzig", "Bergen", "Graz", "Turku"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def _rule(r: random.Random) -> str:
    subject = r.choice(_SUBJECTS)
    return r.choice(
        [
            f"Never execute shell commands on {subject} without explicit approval.",
            f"Always run the {subject} test suite before you push.",
            f"Do not touch the {subject} production database.",
            f"You must ask before deleting anything in {subject}.",
            f"From now on, never log raw tokens in {subject}.",
        ]
    )


def _constraint(r: random.Random) -> tuple[str, str]:
    """A constraint and the later message that changes it."""
    thing = r.choice(["monthly cloud budget", "budget cap", "spending limit", "latency limit", "retry limit"])
    low, high = r.randrange(200, 600, 50), r.randrange(700, 1500, 50)
    unit = "ms" if "latency" in thing else ("retries" if "retry" in thing else "dollars")
    day, later = r.sample(_WEEKDAYS, 2)
    return r.choice(
        [
            (f"Keep the {thing} under {low} {unit}.", f"Actually, raise the {thing} to {high} {unit}."),
            (f"The {thing} must be at most {low} {unit}.", f"Actually, raise the {thing} to {high} {unit}."),
            (f"The release deadline is {day}.", f"Move the release deadline to {later}."),
        ]
    )


def _preference(r: random.Random) -> tuple[str, str]:
    return r.choice(
        [
            ("Please use Fahrenheit for temperatures.", "Actually, use Celsius for temperatures."),
            ("I prefer terse answers.", "Actually, I prefer detailed answers now."),
            ("Please use imperial units.", "Actually, switch to metric units."),
        ]
    )


def _goal(r: random.Random) -> str:
    subject, tool = r.choice(_SUBJECTS), r.choice(_TOOLS)
    return r.choice(
        [
            f"We're migrating {subject} from sessions to {tool}.",
            f"The goal is to cut the p99 latency of {subject} in half.",
            f"I want to move {subject} onto {tool} this quarter.",
        ]
    )


def _decision(r: random.Random) -> str:
    tool, subject = r.choice(_TOOLS), r.choice(_SUBJECTS)
    return r.choice(
        [
            f"We decided to use {tool} for {subject}.",
            f"Let's go with {tool} for the {subject} queue.",
            f"We agreed to keep {subject} on {tool}.",
        ]
    )


def _fact(r: random.Random) -> str:
    return r.choice(
        [
            f"Our on-call team is called {r.choice(_NAMES)}.",
            f"The on-call phone is 0{r.randint(100, 999)} {r.randint(100, 999)} {r.randint(1000, 9999)}.",
            f"We processed {r.randint(10_000, 99_999)} messages on {r.choice(_WEEKDAYS)}.",
            f"The {r.choice(_SUBJECTS)} office is in {r.choice(_CITIES)}.",
        ]
    )


@dataclass
class Planted:
    kind: str
    text: str
    replaced_by: str | None = None


@dataclass
class Session:
    chat: Chat
    planted: list[Planted]
    more: Chat


def session(seed: int, counter: Any, turns: int = 40) -> Session:
    """A conversation planting one item every other turn in the first half, changes in the second."""
    r = random.Random(seed)
    chat = Chat(1, counter)
    planted: list[Planted] = []
    changes: list[tuple[int, Planted]] = []
    makers: list[tuple[str, Callable[[random.Random], str | tuple[str, str]]]] = [
        ("rule", _rule),
        ("constraint", _constraint),
        ("preference", _preference),
        ("goal", _goal),
        ("decision", _decision),
        ("fact", _fact),
    ]
    for turn in range(turns):
        said = _request(r, turn)
        if turn < turns // 2 and turn % 2 == 0:
            kind, make = makers[(turn // 2) % len(makers)]
            made = make(r)
            # One constraint or preference per subject: a second one would rightly supersede the first.
            while isinstance(made, tuple) and any(_same_subject(made[0], p.text) for p in planted):
                made = make(r)
            item = Planted(kind, made[0] if isinstance(made, tuple) else made)
            planted.append(item)
            if isinstance(made, tuple) and r.random() < 0.6:
                changes.append((turns // 2 + len(changes) * 2 + 1, Planted(kind, made[1])))
                item.replaced_by = made[1]
            said = f"{item.text} {said}"
        for at, change in changes:
            if at == turn:
                planted.append(change)
                said = f"{change.text} {said}"
        chat.user(said)
        if turn % 3 == 1:
            path = f"src/{r.choice(_SUBJECTS).replace(' ', '_')}/mod{turn}.py"
            body = "\n".join(f"line {i}: value = {r.randint(0, 999)}" for i in range(30))
            chat.tool(f"call_{turn}", "read_file", {"path": path}, body)
        chat.assistant(" ".join(f"note{turn}x{i}" for i in range(r.randint(60, 140))))
    # A sentence planted twice is changed by the change of either (the state cannot tell them apart).
    changed = {p.text: p.replaced_by for p in planted if p.replaced_by}
    for p in planted:
        p.replaced_by = p.replaced_by or changed.get(p.text)
    more = Chat(len(chat.entries) + 1, counter)
    for turn in range(turns, turns + 10):
        more.user(f"Look at step {turn} please.")
        more.assistant(" ".join(f"note{turn}x{i}" for i in range(90)))
    return Session(chat, planted, more)


_TOPICS = {
    "budget": "money", "cap": "money", "spending": "money", "latency": "latency", "retry": "retries",
    "deadline": "deadline", "fahrenheit": "temperature", "celsius": "temperature", "terse": "length",
    "detailed": "length", "imperial": "units", "metric": "units",
}  # fmt: skip


def _same_subject(a: str, b: str) -> bool:
    """Whether two planted constraints or preferences are about one thing (a later one would rightly
    supersede the earlier, as the user would mean it: the cap and the budget are one limit)."""

    def topics(text: str) -> set[str]:
        return {_TOPICS[w] for w in text.lower().replace(".", "").split() if w in _TOPICS}

    return bool(topics(a) & topics(b))


def _request(r: random.Random, turn: int) -> str:
    """What a user writes around the items: requests, questions, remarks (some with numbers in them)."""
    subject = r.choice(_SUBJECTS)
    sentences = [
        f"Can you check what happened at step {turn} of {subject}?",
        f"Look at the {subject} logs and tell me what you see.",
        f"The build on branch feature-{r.randint(100, 999)} failed twice this morning.",
        f"I think the problem is somewhere in the {subject} handler, maybe the retry path.",
        "Run the tests again and paste the output here.",
        f"It took {r.randint(2, 90)} seconds last time, which seems slow to me.",
        "Also compare it with what we saw yesterday before you change anything.",
        # Remarks a user makes in passing that read like facts too: they compete for the state's room.
        f"The {subject} service has {r.randint(3, 40)} open tickets in the tracker.",
        f"Line {r.randint(10, 900)} of the output mentions a timeout.",
        f"Kim from the {subject} team said the fix is in review.",
    ]
    return " ".join(r.sample(sentences, r.randint(3, 5)))


class Lossy:
    """A weak model's summary: it states nothing the user said."""

    name = "lossy"

    def __init__(self, count: Any) -> None:
        self.count = count
        self.read = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.read += sum(1 for m in request.messages if m.get("role") == "user")
        text = "## Current state\nThe user and the assistant went through several steps of the work."
        return SummaryResult(text, self.name, self.count(text), LlmUsage(calls=1))


class Reading:
    """Wraps a summarizer to count the user turns it read, the summaries due from it and those it wrote
    (a failure falls back to the extractive one; a span too large for it is read in pieces, each due
    in turn), and their tokens."""

    def __init__(self, inner: Summarizer) -> None:
        self.inner, self.name, self.read = inner, inner.name, 0
        self.asked = self.wrote = self.calls = self.prompt = self.completion = self.refused = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.read += sum(1 for m in request.messages if m.get("role") == "user")
        try:
            result = await self.inner.summarize(request)
        except InputTooLargeError:
            raise  # the span is read in pieces, each asked in turn: no summary was due from this ask
        except SummarizerError:
            self.asked += 1  # the fallback writes this one
            raise
        self.asked += 1
        self.wrote += 1
        self.calls += result.usage.calls  # 0: a fold of items with no new turn, merged without a call
        self.prompt += result.usage.prompt_tokens
        self.completion += result.usage.completion_tokens
        self.refused += result.refused
        return result


@dataclass
class Round:
    kept: dict[str, int] = field(default_factory=dict)
    planted: dict[str, int] = field(default_factory=dict)
    resolved: int = 0
    changed: int = 0
    used: float = 0.0
    outcome: str = ""
    writer: str = ""
    """Who wrote the round's summary (the model, or the extractive fallback when it failed)."""


def _limits(window: int, target: int, force: bool) -> strategies.Limits:
    budget = BudgetSettings()
    return strategies.Limits(
        target=target,
        fixed_tokens=0,
        window=window,
        tail_max_messages=20,
        tail_max_tokens=int(0.25 * window),
        max_summary_tokens=2048,
        chunk_budget=max(1, target // 2),
        force=force,
        task_max_tokens=int(min(20_000, 0.2 * window)),
        user_words_max_tokens=int(min(20_000, 0.1 * window)),
        ceilings=(int(budget.trigger_fraction * window * 0.9),),
    )


def _score(history: EffectiveHistory, planted: Sequence[Planted], target: int, tokens: int) -> Round:
    shown = "\n".join(text_of(m) for m in render(history))
    state = "\n".join(text_of(e.message) for e in history.entries if e.edit == STANDING)
    current, _, superseded = state.partition(SUPERSEDED_TITLE)
    out = Round(used=tokens / max(1, target))
    for p in planted:
        if p.replaced_by:
            # Resolved: the new value is there, and the old one is either gone or marked no longer
            # current (a verbatim message that still says it is read beside the mark).
            out.changed += 1
            marked = p.text in superseded and p.text not in current
            if p.replaced_by in shown and (p.text not in shown or marked):
                out.resolved += 1
            continue
        out.planted[p.kind] = out.planted.get(p.kind, 0) + 1
        if p.text in shown:
            out.kept[p.kind] = out.kept.get(p.kind, 0) + 1
    return out


async def run_case(
    seed: int, window: int, share: float, summarizer: str, **llm: Any
) -> tuple[list[Round], Reading | Lossy]:
    counter = counter_for(MODEL, BudgetSettings())
    s = session(seed, counter)
    history = EffectiveHistory((), tuple(s.chat.entries))
    original = sum(e.tokens for e in history.entries)
    # At a 4K window a 40-turn conversation is over the window: the target is the smaller.
    target = max(256, min(int(share * original), int(0.4 * window)))
    made: Reading | Lossy
    if summarizer == "lossy":
        made = Lossy(counter.text)
    elif summarizer == "llm":
        settings = SummarizerSettings(timeout_seconds=900, **llm)
        made = Reading(LiteLLMSummarizer(settings, counter.text, retry=RetrySettings(llm_attempts=2).llm))
    else:
        made = Reading(ExtractiveSummarizer(counter.text))
    fallback = ExtractiveSummarizer(counter.text)
    rounds: list[Round] = []
    for index in range(ROUNDS):
        if index == 1:
            history = history.with_parts(history.chunks, (*history.entries, *s.more.entries))
        result = await strategies.compact(
            history, _limits(window, target, force=index >= 2), [made, fallback], counter
        )
        if result.outcome is Outcome.COMPACTED:
            history = history.with_parts(result.draft.chunks, result.draft.entries)
        tokens = result.tokens_after if result.outcome is Outcome.COMPACTED else result.tokens_before
        scored = _score(history, s.planted, target, tokens)
        scored.outcome = result.outcome.value
        scored.writer = result.summarizer or ""
        rounds.append(scored)
    return rounds, made


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="compaction-worker quality standing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model")
    parser.add_argument("--api-base")
    parser.add_argument("--api-key", default="none", help="the model's API key, if it needs one")
    parser.add_argument(
        "--output",
        choices=["auto", "schema", "grammar", "json", "markdown"],
        default="auto",
        help="what the model is asked to write (summarizer.output): checked items as JSON, or Markdown",
    )
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS))
    parser.add_argument(
        "--only", choices=["extractive", "lossy", "llm"], help="one summarizer (llm needs --model)"
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="short sessions (~2,200 tokens) at absolute budgets, beside simple methods; --short --help: its options",
    )
    asyncio.run(_report(parser.parse_args(argv)))


async def _report(args: argparse.Namespace) -> None:
    summarizers = [args.only] if args.only else ["extractive", "lossy"] + (["llm"] if args.model else [])
    llm = (
        {"model": args.model, "api_base": args.api_base, "api_key": args.api_key, "output": args.output}
        if args.model
        else {}
    )
    rows: list[dict[str, Any]] = []
    for name in summarizers:
        for window in args.windows:
            for share in args.budgets:
                by_round: dict[int, Round] = defaultdict(Round)
                read = asked = wrote = calls = prompt = completion = refused = 0
                all_rounds: list[Round] = []
                for seed in args.seeds:
                    rounds, made = await run_case(seed, window, share, name, **llm)
                    read += made.read
                    if isinstance(made, Reading):
                        asked, wrote, calls = asked + made.asked, wrote + made.wrote, calls + made.calls
                        prompt, completion = prompt + made.prompt, completion + made.completion
                        refused += made.refused
                    all_rounds += rounds
                    for i, r in enumerate(rounds):
                        total = by_round[i]
                        for k in KINDS:
                            total.kept[k] = total.kept.get(k, 0) + r.kept.get(k, 0)
                            total.planted[k] = total.planted.get(k, 0) + r.planted.get(k, 0)
                        total.resolved += r.resolved
                        total.changed += r.changed
                        total.used = max(total.used, r.used)
                worst = {
                    k: min(by_round[i].kept[k] / max(1, by_round[i].planted[k]) for i in range(ROUNDS))
                    for k in KINDS
                }
                rows.append(
                    {
                        "summarizer": name,
                        "window": window,
                        "budget": share,
                        "worst_round": worst,
                        "superseded_resolved": min(
                            by_round[i].resolved / max(1, by_round[i].changed) for i in range(ROUNDS)
                        ),
                        "max_budget_used": max(by_round[i].used for i in range(ROUNDS)),
                        "user_turns_read": read,
                        "writers": sorted({w for r in all_rounds for w in r.writer.split(", ") if w}),
                        # The summaries this summarizer was asked for and wrote (the rest fell back).
                        "summaries_asked": asked,
                        "summaries_written": wrote,
                        "model_calls": calls,
                        "prompt_tokens_per_summary": prompt // max(1, wrote),
                        "output_tokens_per_summary": completion // max(1, wrote),
                        "items_refused": refused,
                        "rounds": [
                            {
                                "kept": r.kept,
                                "planted": r.planted,
                                "resolved": r.resolved,
                                "changed": r.changed,
                            }
                            for r in (by_round[i] for i in range(ROUNDS))
                        ],
                    }
                )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"seeds {args.seeds}; survival in the worst of {ROUNDS} rounds, by kind")
    print(
        "| summarizer | window | budget | " + " | ".join(KINDS) + " | superseded resolved | budget used "
        "| summaries it wrote |"
    )
    print("|---|--:|--:|" + "--:|" * len(KINDS) + "--:|--:|--:|")
    for row in rows:
        kinds = " | ".join(f"{100 * row['worst_round'][k]:.0f}%" for k in KINDS)
        print(
            f"| {row['summarizer']} | {row['window']:,} | {row['budget']:.0%} | {kinds} | "
            f"{100 * row['superseded_resolved']:.0f}% | {row['max_budget_used']:.2f} "
            f"| {row['summaries_written']} of {row['summaries_asked']} |"
        )
