"""Artifact fidelity across compaction cycles: additive chunks with ledgers versus recursive folds.

Run: compaction-worker quality fidelity [--cycles 10] [--seed 7]
     compaction-worker quality fidelity --model openai/local --api-base http://127.0.0.1:8765/v1  (a real model)

A synthetic coding session plants exact artifacts (file paths, shell commands, error
texts, ids, URLs; numbers ride inside them) across its turns. It grows like a live
conversation: turns are appended until the budget check would trigger, then
``strategies.compact()`` runs with the deterministic extractive summarizer and the real
token counter (no LLM). After every cycle the rendered effective history is searched for
each artifact planted so far, verbatim. tests/strategies/test_fidelity.py asserts the
floor on the additive run, the recursive one (a fold's ledger carries what its summary
drops), the default pipeline and the prose case; the others are printed to show where
the figures come from. The prose case (issue 9)
is a chat on an 8K window whose artifacts are only ever written in sentences (inline
commands, errors mid-line, ticket keys, names, facts the user states), summarized by a
summarizer that keeps no identifier at all: what survives, the ledger carried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from compaction_worker import strategies
from compaction_worker.budget.tokens import compute_budget, counter_for
from compaction_worker.budget.windows import resolve_window
from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import EffectiveHistory, Entry, render, text_of
from compaction_worker.formats import tool_call
from compaction_worker.retry import RetrySettings
from compaction_worker.settings import PipelineSettings, Settings, SummarizerSettings
from compaction_worker.summaries.contract import Summarizer, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.llm import LiteLLMSummarizer
from compaction_worker.summaries.prompts import SECTIONS

MODEL = "gpt-4o-mini"  # a 128k window from the bundled registry, o200k tokenizer
PROSE_MODEL = "gpt-4"  # an 8K window
SYSTEM_PROMPT = "You are a careful coding agent. Use the tools; keep exact paths and commands."
SUMMARY_ONLY = PipelineSettings(prune=False, deduplicate=False, truncate_oversized=False)
"""The pipeline with the summary stage alone, so that every cycle summarizes.

With the cheap stages on, pruning clears old tool outputs first and, at this window, is
enough on its own for most cycles; the default-pipeline run measures that path (cleared
outputs keep their artifacts in the placeholder; summaries read the originals).
"""

_TEXT = (
    "the handler reads configuration once and passes it down to every worker so that retries use "
    "one timeout budget while the scheduler keeps the queue short and each batch is written "
    "atomically with its offsets committed only after storage confirms the write"
)
_WORDS = _TEXT.split()
_AREAS = ("billing", "search", "auth", "cache", "ingest", "reports", "export", "notify")
_ERRORS = (
    ("AssertionError", "expected {a}, got {b}"),
    ("KeyError", "'field_{a}' missing from payload {b}"),
    ("TimeoutError", "request {a} took {b}ms (budget 2000ms)"),
    ("ValueError", "invoice total {a}.{b} is negative"),
    ("psycopg.errors.UndefinedColumn", "column orders.col_{a} does not exist (row {b})"),
    ("ConnectionResetError", "[Errno 104] Connection reset by peer after {a} bytes, {b} retries"),
)
# Recurring paths and commands: not measured, but they compete for the ledger as in real work.
_NOISE = ("src/app/main.py", "pyproject.toml", "make test", "git status", "src/app/settings.py")

Turn = tuple[int, list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Planted:
    """One artifact planted in the conversation: its kind and exact text."""

    kind: str
    text: str


class Session:
    """A deterministic synthetic coding session, one task (three exchanges, six turns) at a time.

    Each task plants six artifacts: the file to fix and its ticket (user), the test command
    (tool call and log), the error it prints (log, half of them behind pytest's ``E``),
    the fix's commit and build URL (assistant). The file is read, the command run twice
    and recurring files and commands mentioned, as in real work. Tool outputs are a few
    thousand tokens at ``scale`` 1 (about one artifact per 1,200 tokens); a smaller
    scale packs the same artifacts into shorter outputs.
    """

    def __init__(self, seed: int, scale: float = 1.0) -> None:
        self.rng = random.Random(seed)
        self.scale = scale
        self.seq = 0
        self.calls = 0
        self.planted: list[Planted] = []

    def _prose(self, words: int) -> str:
        return " ".join(self.rng.choices(_WORDS, k=words)).capitalize() + "."

    def _lines(self, low: int, high: int) -> list[str]:
        count = self.rng.randint(max(1, int(low * self.scale)), max(1, int(high * self.scale)))
        return [self._prose(self.rng.randint(20, 40)) for _ in range(count)]

    def _plant(self, kind: str, text: str) -> str:
        self.planted.append(Planted(kind, text))
        return text

    def _user(self, text: str) -> Turn:
        self.seq += 1
        # The request first, then context: how people write to an agent.
        return self.seq, [{"role": "user", "content": f"{text} {self._prose(self.rng.randint(10, 30))}"}]

    def _work(self, tool: str, arguments: Mapping[str, str], output: str, reply: str) -> Turn:
        self.seq += 1
        self.calls += 1
        call = tool_call(f"call_{self.calls}", tool, json.dumps(arguments))
        return self.seq, [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": output},
            {"role": "assistant", "content": f"{reply} {self._prose(self.rng.randint(15, 40))}"},
        ]

    def task(self, k: int) -> Iterator[Turn]:
        """The turns of task ``k``: (turn_seq, messages) six times."""
        area = _AREAS[k % len(_AREAS)]
        noise = self.rng.choice(_NOISE)
        path = self._plant("path", f"src/{area}/module_{k:04d}.py")
        ticket = self._plant("id", f"{area[:3].upper()}-{4000 + k}")
        yield self._user(f"Ticket {ticket}: please fix {path} and keep {noise} as it is.")
        yield self._work("read_file", {"path": path}, "\n".join(self._lines(100, 160)), f"I read {path}.")

        command = self._plant("cmd", f"pytest tests/{area}/test_module_{k:04d}.py -k case_{k:04d} -x")
        exc, template = _ERRORS[k % len(_ERRORS)]
        error = self._plant("error", f"{exc}: {template.format(a=k * 7 + 3, b=k * 13 + 5)}")
        shown = f"E       {error}" if k % 2 else error
        log = "\n".join([f"$ {command}", *self._lines(40, 80), shown, "1 failed"])
        yield self._user("Run its tests first, please.")
        yield self._work("run_command", {"command": command}, log, "The test fails; I will fix it.")

        sha = self._plant("id", uuid.UUID(int=self.rng.getrandbits(128)).hex[:12])
        url = self._plant("url", f"https://ci.example.com/{area}/builds/{9000 + k}")
        passed = "\n".join([f"$ {command}", *self._lines(20, 40), "1 passed"])
        reply = f"Fixed in commit {sha}; the build log is at {url}."
        yield self._user(f"Go ahead, and check {noise} afterwards.")
        yield self._work("run_command", {"command": command}, passed, reply)


_PROSE = (
    "we agreed to keep the rollout slow and to watch the dashboards for a while before touching "
    "anything else because the last change surprised everyone and the team would rather spend an "
    "extra hour checking than another night cleaning up after a hurried fix that nobody reviewed"
)
_PROSE_WORDS = _PROSE.split()
_NAMES = ("orders", "ledger", "search", "billing", "media", "audit", "payments", "catalog", "session")
_REGIONS = ("east", "west", "north", "south", "central")


class ProseSession:
    """A chat about operations in which artifacts are only ever mentioned in prose.

    One message per turn, user and assistant alternating, about 150 tokens each; every
    third turn mentions one artifact in a sentence, cycling through the kinds people
    write: commands in inline code, errors in the middle of a line, errno names with their
    address, ticket keys, commit SHAs, UUIDs, host:port, bucket/cluster/flag names, paths,
    URLs, and numbers with units, dates and versions stated by the user. The planted text
    is the artifact's core, what must stay verbatim. Each ``task`` is six turns.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seq = 0
        self.planted: list[Planted] = []
        self.mentions = 0

    def _prose(self, words: int) -> str:
        return " ".join(self.rng.choices(_PROSE_WORDS, k=words)).capitalize() + "."

    def _plant(self, kind: str, text: str) -> str:
        self.planted.append(Planted(kind, text))
        return text

    def _mention(self) -> str:
        """One sentence naming the next artifact (facts fall on user turns: stated by the user)."""
        k = self.mentions
        self.mentions += 1
        name = _NAMES[k % len(_NAMES)]
        region = _REGIONS[k % len(_REGIONS)]
        sha = uuid.UUID(int=self.rng.getrandbits(128)).hex
        plant = self._plant
        kinds = (
            lambda: f"Please set the memory limit to {plant('fact', f'{384 + 16 * k} MiB')} for it.",
            lambda: f"I ran `{plant('cmd', f'kubectl rollout restart deployment/{name}-{k} -n prod')}` then.",
            lambda: (
                f"The client then saw error: {plant('error', f'ECONNREFUSED 10.0.{k % 250}.7:{5000 + k}')} twice."
            ),
            lambda: f"I opened ticket {plant('id', f'INC-{40000 + k}')} for the on-call team.",
            lambda: (
                f"The freeze starts on {plant('fact', f'2025-{1 + k % 12:02d}-{1 + k % 28:02d}')}, plan for it."
            ),
            lambda: f"The settings live in {plant('path', f'services/{name}/config/rollout-{k}.yaml')} now.",
            lambda: (
                f"The graph is at {plant('url', f'https://grafana.example.com/d/{name}-{k}/latency?orgId=1')}."
            ),
            lambda: (
                f"The worker crashed with {plant('error', f'ValueError: shard {k} of {name} has no leader')}, then recovered."
            ),
            lambda: f"We run Postgres {plant('fact', f'15.{k}')} there, do not upgrade it.",
            lambda: f"That was reverted in commit {plant('id', sha[:12])} this morning.",
            lambda: f"The failing request had id {plant('id', str(uuid.UUID(sha)))} in the logs.",
            lambda: f"The cache at {plant('id', f'{name}-cache.internal:{6000 + k}')} looks healthy again.",
            lambda: f"Keep the timeout at {plant('fact', f'{1000 + 25 * k}ms')} as before.",
            lambda: f"I emptied the bucket {plant('name', f'acme-{name}-{region}-archive')} as asked.",
            lambda: f"The cluster {plant('name', f'{name}-{region}')} took the traffic.",
            lambda: f"The feature flag {plant('name', f'enable_{name}_{region}_batching')} is off for now.",
            lambda: f"The migration failed: {plant('error', f'lock timeout on table {name}_events_{k}')}.",
            lambda: (
                f"Then run `{plant('cmd', f'terraform apply -target=module.{name}_{region} -auto-approve')}` too."
            ),
        )
        return kinds[k % len(kinds)]()

    def task(self, k: int) -> Iterator[Turn]:
        """Six turns, user and assistant alternating; turns 3k and 3k+3 mention an artifact."""
        for i in range(6):
            self.seq += 1
            user = i % 2 == 0
            text = self._prose(self.rng.randint(90, 120))
            if i % 3 == 0:
                middle = self.rng.randint(30, 60)
                words = text.split()
                text = (
                    " ".join(words[:middle])
                    + ". "
                    + self._mention()
                    + " "
                    + " ".join(words[middle:]).capitalize()
                )
            yield self.seq, [{"role": "user" if user else "assistant", "content": text}]


_SYLLABLES = ("ka", "lo", "mi", "ren", "to", "va", "zu", "pe", "sor", "di", "nex", "qua", "bri", "tel")
_SEPARATORS = ("/", ".", ":", "=", "@", "_", "-", "#", "+")
_UNITS = ("ms", "GB", "MiB", "%", "req/s", "EUR", "USD", "rpm", "kB")


class UnlistedKinds:
    """Statements of kinds no pattern in the code names, generated from a seed.

    Each kind is a random shape: two to four parts (a made-up word, a capitalised one, an
    upper-case one, a number, a hex string) joined by random separators, or a made-up
    person's or company's name, or a number with a unit. A kind never seen by whoever wrote
    the extractors stands for the things people really state: e-mail addresses,
    ``NAME=VALUE``, ``kind/name``, image references, header names, flags, prices, ports.
    Each is stated once, mid-sentence, by the user or the assistant, in a six-turn prose
    task like :class:`ProseSession`'s; every other turn states one.
    """

    def __init__(self, seed: int, kinds: int = 12, every: int = 2) -> None:
        self.rng = random.Random(seed)
        self.every = every
        self.seq = 0
        self.planted: list[Planted] = []
        self.kinds = [self._new_kind(i) for i in range(kinds)]

    def _word(self) -> str:
        return "".join(self.rng.choices(_SYLLABLES, k=self.rng.randint(2, 3)))

    def _new_kind(self, index: int) -> Callable[[], str]:
        rng = self.rng
        style = index % 4
        if style == 0:  # a made-up person's or company's name
            return lambda: f"{self._word().capitalize()} {self._word().capitalize()}"
        if style == 1:  # a number with a unit, maybe a currency or a decimal
            unit = rng.choice(_UNITS)
            return lambda: (
                f"{rng.randint(2, 9999)}.{rng.randint(0, 99):02d} {unit}"
                if rng.random() < 0.5
                else f"{rng.randint(10, 99999)}{unit}"
            )
        pieces = [rng.choice(("word", "Word", "UPPER", "number", "hex")) for _ in range(rng.randint(2, 4))]
        joins = [rng.choice(_SEPARATORS) for _ in pieces[1:]]
        if all(p == "word" for p in pieces) and set(joins) <= {"-"}:
            pieces[-1] = "number"  # lowercase words joined by hyphens read as English

        def part(piece: str) -> str:
            if piece == "number":
                return str(rng.randint(2, 65535))
            if piece == "hex":
                return f"{rng.getrandbits(32):08x}"
            word = self._word()
            return {"Word": word.capitalize(), "UPPER": word.upper()}.get(piece, word)

        def make() -> str:
            out = part(pieces[0])
            for join, piece in zip(joins, pieces[1:], strict=True):
                out += join + part(piece)
            return out

        return make

    def _prose(self, words: int) -> str:
        return " ".join(self.rng.choices(_PROSE_WORDS, k=words)).capitalize() + "."

    def _statement(self, kind: int, item: str) -> str:
        return f"and it is {item} for this one"

    def task(self, k: int) -> Iterator[Turn]:
        """Six turns, user and assistant alternating; every ``every``-th turn states one item mid-sentence."""
        for i in range(6):
            self.seq += 1
            text = self._prose(self.rng.randint(90, 120))
            if self.seq % self.every == 1 or self.every == 1:
                kind = self.rng.randrange(len(self.kinds))
                item = self.kinds[kind]()
                self.planted.append(Planted(f"kind{kind}", item))
                words = text.split()
                middle = self.rng.randint(20, 60)
                text = f"{' '.join(words[:middle])} {self._statement(kind, item)} {' '.join(words[middle:])}"
            yield self.seq, [{"role": "user" if i % 4 == 0 else "assistant", "content": text}]


_WEEKDAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_COUNTED = ("messages", "tickets", "users", "rows", "requests", "orders", "files", "retries")
_CALLED = ("called", "named", "known as", "nicknamed")


class ShapelessFacts(UnlistedKinds):
    """Facts with no shape a pattern sees (issue 33): a weekday, a count of things ("80738 messages"),
    a phone number written with spaces, a lowercase name, a month and day; each stated once in prose
    by the user or the assistant, in a sentence that varies, like :class:`UnlistedKinds`'s. What
    must survive is the fact itself (the weekday, the name), not the words around it."""

    def _new_kind(self, index: int) -> Callable[[], str]:
        rng = self.rng
        style = index % 5
        if style == 0:
            return lambda: rng.choice(_WEEKDAY_NAMES)
        if style == 1:
            return lambda: f"{rng.randint(1_000, 99_999)} {rng.choice(_COUNTED)}"
        if style == 2:
            return lambda: f"0{rng.randint(100, 999)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}"
        if style == 3:
            return self._word
        return lambda: f"{rng.choice(_MONTH_NAMES)} {rng.randint(1, 28)}"

    def _statement(self, kind: int, item: str) -> str:
        """How the sentence gives the item: a day is when something happened, a name is what it is called."""
        style = kind % 5
        if style == 0:
            return f"and it happened on {item} for this one"
        if style == 3:
            return f"and the team is {self.rng.choice(_CALLED)} {item} for this one"
        return f"and it is {item} for this one"


_MONTH_NAMES = ("January", "March", "April", "June", "August", "October", "November")


class ParaphrasingSummarizer:
    """Stands for an LLM at its worst: a summary that keeps no artifact verbatim."""

    name = "paraphrase"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        text = "\n".join(f"## {s}\n- (paraphrased)" for s in SECTIONS)
        return SummaryResult(text, self.name, len(text) // 4, LlmUsage())


@dataclass(frozen=True, slots=True)
class Cycle:
    """The effective history right after one compaction cycle."""

    cycle: int
    turns: int
    """Turns in the conversation so far."""
    planted: int
    kept: int
    tokens_before: int
    tokens_after: int
    chunks: int
    stages: tuple[str, ...]
    missing: Mapping[str, int]
    """Planted artifacts not found verbatim, by kind."""

    @property
    def fraction(self) -> float:
        return self.kept / self.planted if self.planted else 1.0


@dataclass(frozen=True, slots=True)
class Run:
    """One configuration's cycles."""

    label: str
    cycles: tuple[Cycle, ...]
    planted: tuple[Planted, ...] = ()
    """Every artifact the session planted."""

    @property
    def final(self) -> float:
        return self.cycles[-1].fraction


def haystack(history: EffectiveHistory) -> str:
    """Every text the model reads: message contents and tool call arguments (decoded)."""
    texts: list[str] = []
    for message in render(history):
        texts.append(text_of(message))
        for call in message.get("tool_calls") or ():
            raw = call["function"]["arguments"]
            arguments = json.loads(raw)
            texts += [str(v) for v in arguments.values()] if isinstance(arguments, dict) else [raw]
    return "\n".join(texts)


async def run_fidelity(
    label: str,
    *,
    cycles: int = 10,
    seed: int = 7,
    scale: float = 1.0,
    recursive: bool = False,
    pipeline: PipelineSettings = SUMMARY_ONLY,
    summarizer: Summarizer | None = None,
    prose: bool = False,
    unlisted: bool = False,
    shapeless: bool = False,
    window: int | None = None,
    every: int = 2,
) -> Run:
    """Grow a session and compact it ``cycles`` times; measure what survives after each.

    ``recursive`` sets the chunk budget to zero, so that every compaction after the first
    folds all chunks into one (recursive-only summaries). Limits are derived from the
    default settings exactly as the worker derives them. ``prose`` runs the prose session
    (:class:`ProseSession`) on :data:`PROSE_MODEL`'s 8K window instead of the coding session;
    ``unlisted`` the session of kinds generated from ``seed`` (:class:`UnlistedKinds`) there,
    stating one item every ``every`` turns. ``window`` replaces the model's own window.
    Raises RuntimeError when a cycle does not compact.
    """
    settings = Settings()
    model = PROSE_MODEL if prose or unlisted or shapeless else MODEL
    counter = counter_for(model, settings.budget)
    budget = compute_budget(resolve_window(model, settings.budget, window), settings.budget)
    limits = strategies.Limits(
        target=budget.target,
        fixed_tokens=counter.text(SYSTEM_PROMPT) + settings.budget.message_overhead_tokens,
        window=budget.window,
        tail_max_messages=settings.tail.max_messages,
        tail_max_tokens=int(settings.tail.max_fraction * budget.window),
        max_summary_tokens=settings.summarizer.max_summary_tokens,
        chunk_budget=0 if recursive else int(budget.target * pipeline.chunk_budget_fraction),
        task_max_tokens=int(min(pipeline.task_max_tokens, pipeline.task_max_fraction * budget.window)),
    )
    overhead = strategies.summary_overhead(counter)
    summarizers = [summarizer or ExtractiveSummarizer(counter.text)]
    session: Session | ProseSession | UnlistedKinds = (
        ShapelessFacts(seed, kinds=10, every=every)
        if shapeless
        else UnlistedKinds(seed, every=every)
        if unlisted
        else ProseSession(seed)
        if prose
        else Session(seed, scale)
    )
    history = EffectiveHistory((), (), system_prompt=SYSTEM_PROMPT)
    n, k, out = 0, 0, []
    transcript: dict[int, Mapping[str, Any]] = {}
    for cycle in range(1, cycles + 1):
        draft = strategies.Draft(history.chunks, history.entries)
        while limits.fixed_tokens + strategies.draft_tokens(draft, overhead) < budget.threshold:
            added: list[Entry] = []
            for seq, messages in session.task(k):
                for message in messages:
                    n += 1
                    added.append(Entry(n=n, seq=seq, message=message, tokens=counter.message(message)))
                    transcript[n] = message
            k += 1
            draft = strategies.Draft(draft.chunks, (*draft.entries, *added))
        history = history.with_parts(draft.chunks, draft.entries)
        # As the worker does: the transcript's originals of what earlier cycles edited.
        originals = {n: transcript[n] for n in strategies.edited_ordinals(history)}
        result = await strategies.compact(
            history, limits, summarizers, counter, settings=pipeline, originals=originals
        )
        if result.outcome is not Outcome.COMPACTED:
            raise RuntimeError(f"cycle {cycle} of {label!r} did not compact: {result.error}")
        history = history.with_parts(result.draft.chunks, result.draft.entries)
        text = haystack(history)
        missing = Counter(p.kind for p in session.planted if p.text not in text)
        planted = len(session.planted)
        out.append(
            Cycle(
                cycle=cycle,
                turns=session.seq,
                planted=planted,
                kept=planted - sum(missing.values()),
                tokens_before=result.tokens_before,
                tokens_after=result.tokens_after,
                chunks=len(history.chunks),
                stages=result.stages,
                missing=dict(missing),
            )
        )
    return Run(label, tuple(out), tuple(session.planted))


async def additive_and_recursive(cycles: int = 10, seed: int = 7, scale: float = 1.0) -> list[Run]:
    """The default summary configuration and the same run with recursive-only summaries."""
    return [
        await run_fidelity("additive + ledger", cycles=cycles, seed=seed, scale=scale),
        await run_fidelity("recursive only", cycles=cycles, seed=seed, scale=scale, recursive=True),
    ]


async def breakdown(cycles: int = 10, seed: int = 7) -> list[Run]:
    """Where the figure comes from: without the ledger, the ledger alone, and the default pipeline."""
    no_ledger = SUMMARY_ONLY.model_copy(update={"artifact_budget_tokens": 0})
    return [
        await run_fidelity("no ledger", cycles=cycles, seed=seed, pipeline=no_ledger),
        await run_fidelity(
            "ledger, no-artifact summary", cycles=cycles, seed=seed, summarizer=ParaphrasingSummarizer()
        ),
        await run_fidelity("default pipeline", cycles=cycles, seed=seed, pipeline=PipelineSettings()),
    ]


async def prose(cycles: int = 10, seed: int = 7) -> Run:
    """The issue's prose case: artifacts only in sentences, 8K window, a summary that keeps no identifier."""
    return await run_fidelity(
        "prose, no-identifier summary",
        cycles=cycles,
        seed=seed,
        prose=True,
        pipeline=PipelineSettings(),
        summarizer=ParaphrasingSummarizer(),
    )


async def unlisted(cycles: int = 10, seed: int = 7, *, shapeless: bool = False) -> Run:
    """Issue 19's case: kinds generated from ``seed``, stated in prose, 8K window, a summary that keeps no
    identifier; with ``shapeless`` issue 33's (weekdays, counts, spaced phone numbers, lowercase names, dates)."""
    return await run_fidelity(
        f"{'shapeless facts' if shapeless else 'unlisted kinds'} (seed {seed})",
        cycles=cycles,
        seed=seed,
        unlisted=not shapeless,
        shapeless=shapeless,
        pipeline=PipelineSettings(),
        summarizer=ParaphrasingSummarizer(),
    )


async def real_model(
    model: str,
    api_base: str | None,
    api_key: str | None,
    *,
    cycles: int = 5,
    seed: int = 7,
    output: Literal["auto", "schema", "grammar", "json", "markdown"] = "auto",
) -> Run:
    """Issue 19's real-model case: 12 facts of seeded kinds over about 60 turns on a 6K window, summarized by ``model``.

    One fact every fifth turn, the default pipeline; folds come as the chunks outgrow their
    budget. Any LiteLLM model string works (``openai/<name>`` with ``api_base`` for a local
    OpenAI-compatible server such as llama-cpp-python's).
    """
    counter = counter_for(PROSE_MODEL, Settings().budget)
    summarizer = LiteLLMSummarizer(
        SummarizerSettings(
            model=model, api_base=api_base, api_key=api_key, timeout_seconds=900, output=output
        ),
        counter.text,
        retry=RetrySettings(llm_attempts=2).llm,
    )
    return await run_fidelity(
        f"{model} (seed {seed})",
        cycles=cycles,
        seed=seed,
        unlisted=True,
        every=5,
        window=6_144,
        pipeline=PipelineSettings(),
        summarizer=summarizer,
    )


def format_runs(runs: Sequence[Run]) -> str:
    """A table: one row per cycle, one column per configuration (kept verbatim / planted)."""
    width = max(len(r.label) for r in runs) + 2
    lines = ["cycle  planted" + "".join(f"{r.label:>{width}}" for r in runs)]
    for i, first in enumerate(runs[0].cycles):
        cells = "".join(f"{f'{c.kept} ({c.fraction:.1%})':>{width}}" for c in (r.cycles[i] for r in runs))
        lines.append(f"{first.cycle:>5}  {first.planted:>7}{cells}")
    for run in runs:
        last = run.cycles[-1]
        lost = ", ".join(f"{kind} {count}" for kind, count in sorted(last.missing.items())) or "none"
        lines.append(
            f"  {run.label}: {run.final:.1%} after {len(run.cycles)} cycles; {last.chunks} chunk(s), "
            f"{last.tokens_after} tokens after; lost: {lost}"
        )
    return "\n".join(lines)


async def _main(cycles: int, seed: int) -> None:
    print("Planted artifacts kept verbatim in the effective history, per compaction cycle")
    print(f"(model {MODEL}, default settings, extractive summarizer, summary stage only)\n")
    print(format_runs(await additive_and_recursive(cycles, seed)))
    print("\nBreakdown: without the ledger; ledger with a summary that keeps no artifact; default pipeline")
    print(format_runs(await breakdown(cycles, seed)))
    print("\nDense session (a stress case): the same artifacts in tool outputs a third as long")
    print(format_runs(await additive_and_recursive(cycles, seed, scale=1 / 3)))
    run = await prose(cycles, seed)
    print(
        f"\nArtifacts in prose: {PROSE_MODEL} (8K window), default pipeline, {run.cycles[-1].turns} turns, "
        "one artifact every third turn, a summarizer that keeps no identifier"
    )
    print(format_runs([run]))
    runs = [await unlisted(cycles, seed + i) for i in range(3)]
    print(
        f"\nKinds no extractor names, generated from seeds {seed}..{seed + 2}: {PROSE_MODEL}, default "
        "pipeline, one item every other turn, a summarizer that keeps no identifier"
    )
    print(format_runs(runs))
    runs = [await unlisted(cycles, seed + i, shapeless=True) for i in range(3)]
    print(
        f"\nFacts with no shape (weekdays, counts, spaced phone numbers, lowercase names, dates), seeds "
        f"{seed}..{seed + 2}: {PROSE_MODEL}, default pipeline, a summarizer that keeps nothing"
    )
    print(format_runs(runs))


async def _real(
    model: str, api_base: str | None, api_key: str | None, cycles: int, seed: int, *, output: Any = "auto"
) -> None:
    print(
        f"Facts of seeded kinds kept verbatim, summarized by {model} ({output}): 6K window, one fact every fifth turn"
    )
    run = await real_model(model, api_base, api_key, cycles=cycles, seed=seed, output=output)
    print(format_runs([run]))
    for cycle in run.cycles:
        print(f"  cycle {cycle.cycle}: {', '.join(cycle.stages)}; {cycle.chunks} chunk(s)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="compaction-worker quality fidelity", description="Artifact fidelity across compaction cycles."
    )
    parser.add_argument("--cycles", type=int, default=None, help="10 without --model, 5 with it")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--model", help="a LiteLLM model string: summarize with it (the real-model case)")
    parser.add_argument(
        "--api-base", help="the model's API base, e.g. a local server's http://127.0.0.1:8765/v1"
    )
    parser.add_argument("--api-key", default="none", help="the model's API key, if it needs one")
    parser.add_argument(
        "--output",
        choices=["auto", "schema", "grammar", "json", "markdown"],
        default="auto",
        help="what the model is asked to write (summarizer.output): checked items as JSON, or Markdown",
    )
    args = parser.parse_args(argv)
    if args.model:
        asyncio.run(
            _real(args.model, args.api_base, args.api_key, args.cycles or 5, args.seed, output=args.output)
        )
    else:
        asyncio.run(_main(args.cycles or 10, args.seed))
