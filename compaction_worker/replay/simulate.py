"""A recorded conversation replayed offline, turn by turn, through the worker's budget and pipeline.

No broker or Redis: the conversation's metadata and effective history are kept in memory,
in the worker's own types (``Meta``, ``EffectiveHistory``). Each turn is appended as the
per-turn path appends it, checked with its threshold rule, and a compaction it sets off
runs the worker's pipeline and is applied as the worker's commit applies it
(``compactor.applied``). The one difference: a compaction lands before the next turn,
where the worker runs it in the background while turns keep arriving.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from compaction_worker import strategies
from compaction_worker.budget.economics import Prices
from compaction_worker.budget.threshold import calibrated_total, scale_of, threshold_trigger
from compaction_worker.budget.tokens import Budget, budget_for, conversation_budget, counter_for
from compaction_worker.budget.windows import resolve_window
from compaction_worker.contracts.events import LlmUsage, Outcome, Trigger, TurnEvent, validation_summary
from compaction_worker.contracts.history import EffectiveHistory, Entry, render, text_of
from compaction_worker.conversation.decide import decide
from compaction_worker.conversation.meta import Meta
from compaction_worker.replay.cache import PEERS, Block, CacheFigures, CacheMeter, block, message_blocks, peer
from compaction_worker.replay.reader import Conversation, ReplayInputError
from compaction_worker.runtime.compactor import Summarizers, applied, context_status
from compaction_worker.runtime.limits import limits_for
from compaction_worker.runtime.payoff import floor_of, paid
from compaction_worker.settings import Settings
from compaction_worker.strategies.draft import add_usage
from compaction_worker.summaries.contract import Summarizer, SummaryRequest, SummaryResult

DEFAULT_MODEL = "gpt-4o-mini"
"""The model of a conversation whose record names none and no ``--model`` was given."""

MAX_RUNS_PER_TURN = 8
"""A guard: after a commit the worker runs again on the same turn only while the history is over
its window (the threshold rule's ``compacted_seq``), which one run brings it under."""

_NOW = 0.0
"""Replay time for the threshold rule: failed runs set no backoff here, so it never matters."""
REPLAY_ID = "replay"
"""The conversation id of the turns the replay decides (a recorded conversation's name may be no valid id)."""
PRODUCT = "compaction-worker"
"""The product's name beside the peers' (``cache.PEERS``) in the calls table."""
SMALL_SAVING = 0.10
"""A compaction that saves less than this share of a history within its window is a small one
(the share the issue that counted them used: each costs a cache rewrite, and a summary call)."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """One pipeline run during the replay: why, at which turn, what it did."""

    turn: int
    trigger: Trigger
    outcome: Outcome
    tokens_before: int
    tokens_after: int
    stages: tuple[str, ...] = ()
    usage: LlmUsage = field(default_factory=LlmUsage)
    error: str | None = None
    summary_calls: int = 0
    """Requests to the first summarizer: with an LLM configured, each is a paid call."""

    def small(self, available: int) -> bool:
        """Whether it committed a saving under :data:`SMALL_SAVING` of a history within ``available``."""
        saved = self.tokens_before - self.tokens_after
        return (
            self.outcome is Outcome.COMPACTED
            and self.tokens_before <= available
            and saved < SMALL_SAVING * self.tokens_before
        )


@dataclass(frozen=True, slots=True)
class Tally:
    """What one or more replayed conversations' compactions cost, counted (:meth:`per_100_turns`)."""

    turns: int = 0
    compactions: int = 0
    small_compactions: int = 0
    """Commits that saved under :data:`SMALL_SAVING` of a history within its window."""
    multi_run_turns: int = 0
    """Turns that set off more than one run."""
    summary_calls: int = 0
    cache_breaks: int = 0
    dollars: float | None = None
    """The product's calls (summaries included) at the model's prices; None when unpriced."""

    def __add__(self, other: Tally) -> Tally:
        dollars = (
            None
            if self.dollars is None and other.dollars is None
            else (self.dollars or 0.0) + (other.dollars or 0.0)
        )
        return Tally(
            self.turns + other.turns,
            self.compactions + other.compactions,
            self.small_compactions + other.small_compactions,
            self.multi_run_turns + other.multi_run_turns,
            self.summary_calls + other.summary_calls,
            self.cache_breaks + other.cache_breaks,
            dollars,
        )

    def per_100_turns(self) -> dict[str, float | None]:
        """Each count per 100 turns (0 with no turns)."""
        scale = 100 / self.turns if self.turns else 0.0
        return {
            "compactions": self.compactions * scale,
            "small_compactions": self.small_compactions * scale,
            "multi_run_turns": self.multi_run_turns * scale,
            "summary_calls": self.summary_calls * scale,
            "cache_breaks": self.cache_breaks * scale,
            "dollars": None if self.dollars is None else self.dollars * scale,
        }


@dataclass(frozen=True, slots=True)
class TurnPoint:
    """Context tokens after a turn was appended, and after the compactions it set off."""

    turn: int
    tokens: int
    after: int


@dataclass(slots=True)
class ConversationReport:
    """What replaying one conversation did, and the effective history it ended with."""

    name: str
    model: str
    budget: Budget
    meta: Meta
    history: EffectiveHistory
    window_source: str = "registry"
    """Where the window came from: ``event`` (the record or --context-window), ``registry``, ``fallback``..."""
    source: str = ""
    points: list[TurnPoint] = field(default_factory=list)
    runs: list[Compaction] = field(default_factory=list)
    cache: list[CacheFigures] = field(default_factory=list)
    """The product's prompts and the peers' (:mod:`compaction_worker.replay.cache`), product first."""

    @property
    def compactions(self) -> list[Compaction]:
        """The runs that committed a smaller history."""
        return [c for c in self.runs if c.outcome is Outcome.COMPACTED]

    def by_trigger(self) -> dict[str, int]:
        return dict(Counter(c.trigger.value for c in self.compactions))

    @property
    def tokens_saved(self) -> int:
        return sum(c.tokens_before - c.tokens_after for c in self.compactions)

    @property
    def usage(self) -> LlmUsage:
        total = LlmUsage()
        for c in self.runs:
            total = add_usage(total, c.usage)
        return total

    @property
    def calls(self) -> CacheFigures | None:
        """The product's calls (one per turn, with the effective history), once the replay has run."""
        return next((f for f in self.cache if f.strategy == PRODUCT), None)

    @property
    def peak(self) -> int:
        """The peak prompt (``cli_output.PEAK_PROMPT``): the largest prompt the product's calls sent,
        the largest ``after`` of the points.

        Not the largest context after a turn's append (``points``' ``tokens``, the sawtooth's
        teeth): here a compaction lands before the next call, so no call sends that.
        """
        ours = self.calls
        return ours.peak_tokens if ours is not None else 0

    def tally(self) -> Tally:
        """Its compactions counted: small ones, turns of several runs, summary calls, cache breaks, dollars."""
        runs_by_turn = Counter(c.turn for c in self.runs)
        ours = self.calls
        dollars = ours.dollars if ours is not None else None
        return Tally(
            turns=len(self.points),
            compactions=len(self.compactions),
            small_compactions=sum(c.small(self.budget.available) for c in self.runs),
            multi_run_turns=sum(n > 1 for n in runs_by_turn.values()),
            summary_calls=sum(c.summary_calls for c in self.runs),
            cache_breaks=ours.breaks if ours is not None else 0,
            dollars=dollars.total if dollars is not None else None,
        )


class _Counted:
    """A summarizer whose requests are counted: the replay's measure of summary calls (each one
    paid with an LLM), whichever summarizer is configured."""

    def __init__(self, summarizer: Summarizer) -> None:
        self.summarizer = summarizer
        self.name = summarizer.name
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        return await self.summarizer.summarize(request)

    def __getattr__(self, name: str) -> Any:
        # What else the summary stage asks of it (its input limit: contract.InputLimited), if it has it.
        return getattr(self.summarizer, name)


def split_turns(messages: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[list[dict[str, Any]]]]:
    """The leading system messages (as the turn's ``system_prompt``) and the turns.

    A user message starts a turn, and so does an assistant message after a tool result: an
    agent's next step, which a runtime publishes as a turn of its own (a tool loop is one
    user request but many model calls).
    """
    start = 0
    while start < len(messages) and messages[start].get("role") == "system":
        start += 1
    system = "\n\n".join(text_of(m) for m in messages[:start]) or None
    turns: list[list[dict[str, Any]]] = []
    previous: str | None = None
    for message in messages[start:]:
        role = message.get("role")
        if not turns or role == "user" or (role == "assistant" and previous == "tool"):
            turns.append([])
        turns[-1].append(dict(message))
        previous = role
    return system, turns


def _events(name: str, model: str, turns: Sequence[Sequence[Mapping[str, Any]]]) -> list[TurnEvent]:
    """The turns as a runtime would publish them; one the worker would refuse is the input's error."""
    events = []
    for seq, messages in enumerate(turns, start=1):
        turn = {"conversation_id": REPLAY_ID, "turn_seq": seq, "model": model, "messages": messages}
        try:
            events.append(TurnEvent.model_validate(turn))
        except ValidationError as e:
            reason = validation_summary(e, limit=3)
            raise ReplayInputError(f"{name}: turn {seq} is not a valid conversation.turn ({reason})") from e
    return events


class Replay:
    """Replays one conversation; :meth:`run` returns its report."""

    def __init__(
        self,
        conversation: Conversation,
        settings: Settings,
        summarizers: Summarizers,
        *,
        model: str | None = None,
        context_window: int | None = None,
    ) -> None:
        self.settings = settings
        self.summarizers = summarizers
        self.name = conversation.name
        model = model or conversation.model or DEFAULT_MODEL
        window = context_window or conversation.context_window
        budget_settings = settings.budget
        unknown = resolve_window(model, budget_settings, None).source == "fallback"
        if unknown and budget_settings.fallback_window is None and window is None:
            raise ReplayInputError(
                f"{self.name}: model {model!r} has no known context window; pass --context-window"
            )
        system, turns = split_turns(conversation.messages)
        self.events = _events(self.name, model, turns)
        self.counter = counter_for(model, budget_settings)
        tools = conversation.tools
        info, budget = budget_for(model, budget_settings, window, None)
        # The fields the per-turn path writes (turns.TurnHandler._append).
        self.meta = Meta(
            model=model,
            window=budget.window,
            threshold=budget.threshold,
            overhead_tokens=budget_settings.conversation_overhead_tokens,
            system_prompt=system,
            system_tokens=(
                self.counter.text(system) + budget_settings.message_overhead_tokens if system else 0
            ),
            tools=tools,
            tools_tokens=self.counter.tools(tools),
            context_window=window,
        )
        self.history = EffectiveHistory(chunks=(), entries=(), system_prompt=system, tools=tools)
        self.transcript: list[Mapping[str, Any]] = []
        # What each call sends (replay.cache): the tools lead every prompt, then the messages.
        self.tools_block: list[Block] = [block({"tools": tools}, self.meta.tools_tokens)] if tools else []
        system_block = (
            [block({"role": "system", "content": system}, self.meta.system_tokens)] if system else []
        )
        self.head = [*self.tools_block, *system_block]
        self.turn_blocks: list[list[Block]] = []
        self.meter = CacheMeter()
        self._blocks: dict[str, list[Block]] = {}
        self._output_tokens = 0
        self.report = ConversationReport(
            self.name,
            model,
            budget,
            self.meta,
            self.history,
            window_source=info.source,
            source=conversation.source,
        )

    async def run(self, on_turn: Callable[[], None] = lambda: None) -> ConversationReport:
        """Append every turn, compacting where the worker would; ``on_turn`` is called after each."""
        for event in self.events:
            await self.turn(event)
            on_turn()
        self.report.meta, self.report.history = self.meta, self.history
        self.report.cache = self.cache_figures()
        return self.report

    def cache_figures(self) -> list[CacheFigures]:
        """The product's calls and the peers' on the same turns, priced at the conversation's model
        (the product's summaries at the summarizer's model)."""
        prices = Prices.of(self.meta.model)
        output = self._output_tokens
        configured = self.settings.summarizer.model
        by = Prices.of(self.meta.model if configured in (None, "conversation") else configured)
        usage = self.report.usage
        figures = [
            self.meter.figures(
                PRODUCT,
                output,
                prices,
                summarizer=(usage.prompt_tokens, usage.completion_tokens),
                summarizer_prices=by,
            )
        ]
        budget = self.report.budget
        for strategy in PEERS:
            meter, spent = peer(
                strategy,
                self.head,
                self.turn_blocks,
                threshold=budget.threshold,
                target=budget.target,
                summary_tokens=int(budget.target * self.settings.pipeline.summary_share),
                framing=self.meta.overhead_tokens,
            )
            figures.append(meter.figures(strategy, output, prices, summarizer=spent))
        return figures

    def _prompt(self) -> list[Block]:
        """The effective history as the runtime sends it next, as prompt blocks."""
        blocks = list(self.tools_block)
        for message in render(self.history, self.settings.pipeline.summary_placement):
            digest, _ = block(message, 0)
            if digest not in self._blocks:
                self._blocks[digest] = message_blocks(
                    message, self.counter.message(message), self.counter.text
                )
            blocks += self._blocks[digest]
        return blocks

    def total(self) -> int:
        """The conversation's context as the threshold rule sees it (calibrated estimate)."""
        return calibrated_total(self.meta)

    async def turn(self, event: TurnEvent) -> None:
        """Append one turn as the worker decides it (conversation/decide.py: ``decide``, on the meta the
        replay keeps), then run the compactions it sets off."""
        seq = event.turn_seq
        planned = decide(self.meta, event, self.settings, now=_NOW)
        plan = planned.plan
        entries = []
        for new in planned.write.messages:
            self.transcript.append(new.message)
            entries.append(Entry(len(self.transcript), seq, new.message, new.tokens))
        self.turn_blocks.append(
            [b for e in entries for b in message_blocks(e.message, e.tokens, self.counter.text)]
        )
        if seq > 1:  # the previous call's reply
            self._output_tokens += sum(e.tokens for e in entries if e.message.get("role") == "assistant")
        self.meta = plan.after
        self.history = self.history.with_parts(self.history.chunks, (*self.history.entries, *entries))
        tokens = self.total()
        trigger = plan.job.trigger if plan.job is not None else None
        for _ in range(MAX_RUNS_PER_TURN):
            if trigger is None:
                break
            run = await self.compact(seq, trigger)
            self.report.runs.append(run)
            if run.outcome is not Outcome.COMPACTED:
                break
            # As Compactor._reschedule_if_still_over: on the same turn, another run only while the
            # history is over its window (the commit's compacted_seq).
            trigger = threshold_trigger(self.meta, self.settings.budget, _NOW)
        # The turn's job ran (or failed: the next turn asks again), as a worker's would before the next turn.
        self.meta = self.meta.without_job()
        after = self.total()
        self.report.points.append(TurnPoint(seq, tokens, after))
        self.meter.call(self._prompt(), after)  # the size the threshold and the window are in

    async def compact(self, seq: int, trigger: Trigger) -> Compaction:
        """One run as ``Compactor._compact`` does it (no lock, no events, no circuit breaker)."""
        meta, history = self.meta, self.history
        settings = self.settings.budget
        counter = counter_for(meta.model, settings)
        _, budget = conversation_budget(meta, settings)
        scale = scale_of(meta)
        limits = limits_for(self.settings, meta, budget, budget.target, scale, force=False)
        summarizers: list[Summarizer] = list(self.summarizers(meta.model, counter))
        primary = summarizers[0] = _Counted(summarizers[0])
        originals = {n: self.transcript[n - 1] for n in strategies.edited_ordinals(history)}
        before = self.total()
        try:
            result = await strategies.compact(
                history,
                limits,
                summarizers,
                counter,
                settings=self.settings.pipeline,
                originals=originals,
                conversation_id=self.name,
                conversation_model=meta.model,
            )
        except Exception as e:  # as in the worker: a failed compaction is an outcome, the replay goes on
            self.meta = replace(meta, failures=meta.failures + 1)
            error = f"{type(e).__name__}: {e}"
            return Compaction(
                seq, trigger, Outcome.FAILED, before, before, error=error, summary_calls=primary.calls
            )
        result = paid(
            result,
            trigger,
            before=before,
            scale=scale,
            target=budget.target,
            budget=budget,
            settings=settings,
        )
        floor = floor_of(result, scale=scale, target=budget.target)
        if result.shrinks:
            self.history, delta = applied(history, result, counter)
            # What the commit script writes (replace.lua): new totals and version, the no-op mark
            # cleared, the threshold rule's marks set.
            self.meta = replace(
                meta,
                history_tokens=meta.history_tokens + delta,
                version=meta.version + 1,
                context_status=context_status(result.draft),
                noop_tokens=0,
                failures=0,
                retry_after=0.0,
                floor_tokens=floor,
                compacted_seq=meta.last_seq,
            )
            return Compaction(
                seq,
                trigger,
                Outcome.COMPACTED,
                before,
                self.total(),
                result.stages,
                result.usage,
                result.error,
                primary.calls,
            )
        # As Compactor._noop: remember the size that could not shrink (enough), and the floor.
        self.meta = replace(
            meta, noop_tokens=calibrated_total(meta) or 1, floor_tokens=floor or meta.floor_tokens
        )
        error = result.error or "the compaction would not shrink the history"
        return Compaction(seq, trigger, Outcome.NOOP, before, before, (), result.usage, error, primary.calls)
