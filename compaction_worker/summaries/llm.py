"""The LiteLLM summarizer: the only module that calls an LLM.

It asks any LiteLLM model for a structured summary (prompt from
:mod:`compaction_worker.summaries.prompts`), with retries (the one failure policy,
:class:`~compaction_worker.retry.RetryPolicy`) and fallback models, and returns only
summaries that pass :func:`~compaction_worker.summaries.contract.validate_summary`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.trace import SpanKind

from compaction_worker import _litellm
from compaction_worker.budget.overflow import OverflowInfo, detect_overflow
from compaction_worker.budget.windows import known_window
from compaction_worker.contracts.events import LlmUsage
from compaction_worker.observability import metrics, tracing
from compaction_worker.offload import off_loop
from compaction_worker.retry import RetryPolicy
from compaction_worker.settings import SummarizerSettings
from compaction_worker.summaries import schema
from compaction_worker.summaries.contract import (
    CountTokens,
    InputTooLargeError,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    summary_problem,
)
from compaction_worker.summaries.prompts import (
    clamp_tool_output,
    compose_prompt,
    default_instructions,
    shorter_note,
    transcript_blocks,
)

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@functools.cache
def _error_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """LiteLLM's retryable and final error types, read when the first call fails (not at import)."""
    errors = _litellm.load().exceptions
    # Status codes worth asking again: the request was fine, the service was not.
    retryable = (
        errors.Timeout,
        errors.APIConnectionError,
        errors.RateLimitError,
        errors.InternalServerError,
        errors.ServiceUnavailableError,
        errors.BadGatewayError,
    )
    final = (
        errors.BadRequestError,  # includes ContextWindowExceededError, ContentPolicyViolationError
        errors.AuthenticationError,
        errors.PermissionDeniedError,
        errors.NotFoundError,
        errors.UnprocessableEntityError,
        errors.BudgetExceededError,
    )
    return retryable, final


_CUT_OFF: Final = frozenset({"length", "max_tokens", "model_context_window_exceeded"})
CUT_OFF_RETRIES: Final = 2
"""A summary cut off at the output limit is asked again this often, each time for a shorter one."""
_PER_MESSAGE_TOKENS: Final = 4


def is_retryable(error: BaseException) -> bool:
    """Whether a failed call is worth repeating: timeouts, connection errors, 429 and 5xx."""
    retryable, final = _error_types()
    if isinstance(error, final):
        return False
    if isinstance(error, retryable):
        return True
    status = getattr(error, "status_code", None)
    if isinstance(status, int):
        return status in (408, 409, 429) or status >= 500
    return isinstance(error, TimeoutError | ConnectionError)


class _ModelFailed(Exception):
    """One model gave up; the next fallback gets its turn."""

    def __init__(self, reason: str, *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.too_large = too_large


class _Again(Exception):
    """Ask the model again at once, on the prompt adapted (tool outputs cut, a shorter summary asked)."""


class _Transient(Exception):
    """A try that failed in a way worth repeating after a backoff: a retryable error, a transiently bad reply."""


@dataclass(slots=True)
class _Asked:
    """How a model's prompt is adapted so far; kept across its tries."""

    clamped: bool = False
    """Long tool outputs cut to head and tail."""
    shorter: int = 0
    """Times a shorter summary was asked for (its output was cut off)."""
    markdown: bool = False
    """A JSON reply was refused (it did not parse, cited turns outside its span, kept no item): the
    model is asked for Markdown instead."""


_ADAPTED: Final = RetryPolicy(CUT_OFF_RETRIES + 3, base_seconds=0.0, cap_seconds=0.0)
"""The asks of one try: the first, once more with tool outputs cut, once as Markdown after a refused
JSON reply, and a shorter summary up to :data:`CUT_OFF_RETRIES` times; at once (nothing failed)."""

Output = str
"""How a model is asked: ``schema`` (JSON, ``response_format`` sent), ``grammar`` (the same schema in
the ``json_object`` shape local servers enforce as a grammar), ``json`` (JSON asked in the
prompt) or ``markdown``."""


@functools.cache
def _supports_schema(model: str) -> bool:
    try:
        return bool(_litellm.load().supports_response_schema(model=model))
    except Exception:  # a model LiteLLM's map does not know
        return False


@dataclass(slots=True)
class _Usage:
    calls: int = 0
    prompt: int = 0
    completion: int = 0
    cost: float | None = None

    def add(self, response: Any) -> tuple[int, int, float | None]:
        """Add one response's usage; returns its input and output tokens and its cost."""
        usage = getattr(response, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        self.prompt += prompt
        self.completion += completion
        try:
            cost = _litellm.load().completion_cost(completion_response=response)
        except Exception:  # models without a price in LiteLLM's map raise; cost unknown
            cost = None
        if cost is not None:
            self.cost = (self.cost or 0.0) + float(cost)
        return prompt, completion, None if cost is None else float(cost)

    def event(self) -> LlmUsage:
        return LlmUsage(
            calls=self.calls,
            prompt_tokens=self.prompt,
            completion_tokens=self.completion,
            total_tokens=self.prompt + self.completion,
            cost_usd=self.cost,
        )


class LiteLLMSummarizer:
    """Summaries from any LiteLLM model, with retries and fallback models.

    Each model is tried in turn (``settings.model``, then ``settings.fallback_models``).
    A retryable failure is asked again as ``retry`` says (tries, backoff with full jitter);
    any other failure, or an invalid summary, moves on to the next model. A model's input
    limit is the smallest of ``settings.max_input_tokens``, its window in LiteLLM's registry
    minus the reply, and what its overflow errors taught this instance. A prompt over it has
    its long tool outputs cut to head and tail; if it is still over, the model is not asked,
    and when that happens to the first model the summary fails with
    :class:`InputTooLargeError`: the caller splits the span (:meth:`transcript_limit` says
    how much fits). No message is dropped to make room.
    """

    def __init__(
        self,
        settings: SummarizerSettings,
        count_tokens: CountTokens,
        *,
        retry: RetryPolicy,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.name = settings.model or "extractive"
        self._count = count_tokens
        self._retry = retry
        self._sleep = sleep
        self._rng = rng
        self._key = settings.api_key.get_secret_value() if settings.api_key else None
        # Redaction replaces the key wherever it appears; a placeholder key such as "fake"
        # or "none" would mangle ordinary words, and is no secret.
        self._secret = self._key if self._key and len(self._key) >= 8 else None
        self._learned: dict[str, int] = {}
        """Prompt limits that models' overflow errors revealed, in our counter's tokens."""

    def __repr__(self) -> str:
        return f"<LiteLLMSummarizer {self.name} fallbacks={self.settings.fallback_models}>"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Summarize with the first model that produces a valid summary; a fold of items with no new
        turn is their merge, without a call (:meth:`_merged`)."""
        if (merged := self._merged(request)) is not None:
            return merged
        await _litellm.loaded()  # a worker's first compaction may come before its import ends
        models = self._models(request)
        system = self._instructions(request)
        usage = _Usage()
        failures: list[str] = []
        cause: BaseException | None = None
        primary_too_large = False
        for model in models:
            try:
                return await self._with_model(model, request, system, usage)
            except _ModelFailed as e:
                failures.append(f"{model}: {e}")
                cause = e.__cause__ or cause
                primary_too_large = primary_too_large or (e.too_large and model == models[0])
                # Sized out is the caller's to handle (it splits the span); anything else is a failure.
                log.log(
                    logging.INFO if e.too_large else logging.WARNING,
                    "summary by %s %s: %s",
                    model,
                    "does not fit" if e.too_large else "failed",
                    e,
                )
        message = self._redact("no valid summary from " + "; ".join(failures))
        # The failed calls were paid for: the caller adds their usage to the compaction's.
        spent = usage.event() if usage.calls else None
        if primary_too_large:
            limit = self.transcript_limit(request)
            raise InputTooLargeError(message, transcript_limit=limit, usage=spent) from cause
        raise SummarizerError(message, usage=spent) from cause

    def _merged(self, request: SummaryRequest) -> SummaryResult | None:
        """A fold with no turn to read and every earlier summary items: the items as they are (each
        keeps its bytes), the oldest resolved, then the oldest, let go until they fit; no call, for a
        model has nothing new to say of them. None when that is not the case, or nothing is left."""
        if request.messages or not request.folds or not request.items or not all(request.itemized):
            return None
        budget = request.max_summary_tokens
        if request.replaced_tokens > 0:
            budget = min(budget, request.replaced_tokens - 1)
        items, dropped = schema.fit([schema.Item.decode(raw) for raw in request.items], budget, self._count)
        if not any(not item.resolved for item in items):
            return None
        text = schema.render(items)
        if summary_problem(text, self._count(text), request) is not None:
            return None
        return SummaryResult(
            text,
            self.name,
            self._count(text),
            LlmUsage(),
            items=tuple(item.encode() for item in items),
            let_go=len(dropped),
        )

    def transcript_limit(self, request: SummaryRequest) -> int | None:
        """Tokens of transcript the first model takes around this request's frame; None if unknown.

        The first model is the one the span is split for: a fallback model with a smaller
        window takes what fits it and leaves the rest to the next summarizer.
        """
        try:
            model = self._models(request)[0]
            output = self._output(model, _Asked(), request)
            system = self._system(request, output, _Asked(), self._instructions(request))
        except SummarizerError:
            return None  # summarize() fails the same way, without a call
        limit = self._input_limit(model, request)
        if limit is None:
            return None
        frame = compose_prompt(request, system, [], items=self._listing(request, output))
        # A little headroom: token counts of blocks do not add up exactly to the whole.
        return max(0, int(limit * 0.97) - self._tokens(frame))

    def _models(self, request: SummaryRequest) -> list[str]:
        primary = self.settings.model or ""
        if primary == "conversation":
            primary = request.conversation_model
        models = list(dict.fromkeys(m for m in (primary, *self.settings.fallback_models) if m))
        if not models:
            raise SummarizerError(
                "no summarizer model: 'conversation' was configured but the request names none"
            )
        return models

    def _output(self, model: str, asked: _Asked, request: SummaryRequest) -> Output:
        """How ``model`` is asked this time (``settings.output``; Markdown after a refused JSON reply, and
        for a fold of Markdown summaries with no turn to cite)."""
        output = self.settings.output
        if asked.markdown or not (request.messages or request.items):
            return "markdown"
        if output == "auto":
            if self.settings.prompt or self.settings.prompt_file is not None:
                return "markdown"  # a deployment's own prompt asks for what it asks for
            return "schema" if _supports_schema(model) else "json"
        return output

    def _system(self, request: SummaryRequest, output: Output, asked: _Asked, markdown: str) -> str:
        if output == "markdown":
            return (
                markdown + shorter_note(request.max_summary_tokens, asked.shorter)
                if asked.shorter
                else markdown
            )
        return schema.instructions(
            schema.Limits.for_room(request.max_summary_tokens), anchored=bool(request.items)
        )

    @staticmethod
    def _listing(request: SummaryRequest, output: Output) -> str:
        if output == "markdown" or not request.items:
            return ""
        return schema.listing([schema.Item.decode(raw) for raw in request.items])

    def _instructions(self, request: SummaryRequest) -> str:
        if self.settings.prompt:
            return self.settings.prompt
        if self.settings.prompt_file is not None:
            try:
                return self.settings.prompt_file.read_text(encoding="utf-8")
            except OSError as e:
                raise SummarizerError(
                    f"cannot read the summary prompt file {self.settings.prompt_file}: {e}"
                ) from e
        return default_instructions(request.max_summary_tokens)

    async def _with_model(
        self, model: str, request: SummaryRequest, system: str, usage: _Usage
    ) -> SummaryResult:
        """``model``'s summary, by the retry driver: a try that fails in a way worth repeating is
        made again after ``retry``'s backoff; within a try, the prompt adapted (tool outputs cut,
        a shorter summary asked) is asked again at once."""
        asked = _Asked()

        async def one_try() -> SummaryResult:
            return await _ADAPTED.run(
                lambda: self._ask(model, request, system, usage, asked),
                retry_if=lambda error: isinstance(error, _Again),
            )

        try:
            return await self._retry.run(
                one_try,
                retry_if=lambda error: isinstance(error, _Transient),
                on_retry=lambda error, failures: log.warning(
                    "summary by %s failed (%s); try %d of %d",
                    model,
                    error,
                    failures + 1,
                    self._retry.attempts,
                ),
                sleep=self._sleep,
                rng=self._rng,
            )
        except _Transient as last:
            raise _ModelFailed(str(last)) from last.__cause__

    async def _ask(
        self, model: str, request: SummaryRequest, system: str, usage: _Usage, asked: _Asked
    ) -> SummaryResult:
        """One call of ``model`` on the prompt as ``asked`` so far, and its summary. Raises
        :class:`_Again` to ask again at once on an adapted prompt, :class:`_Transient` for a failure
        worth a backoff, :class:`_ModelFailed` to give the model up."""
        limit = self._input_limit(model, request)
        output = self._output(model, asked, request)
        instructions = self._system(request, output, asked, system)
        # Building and counting a large span's prompt is CPU: in a thread, off the event loop.
        prompt = await off_loop(self._prompt, request, instructions, clamped=asked.clamped, output=output)
        size = await off_loop(self._tokens, prompt)
        if limit is not None and size > limit:
            if not asked.clamped:
                asked.clamped = True  # cut long tool outputs before spending a call
                raise _Again
            raise _ModelFailed(
                f"the summarizer's input ({size} tokens) is over its limit ({limit})", too_large=True
            )
        try:
            response: Any = await self._call(model, prompt, request, usage, output)
        except Exception as e:
            self._scrub(e)
            overflow = detect_overflow(e)
            if overflow is not None:
                self._learn(model, overflow, size, request, system)
                log.info(
                    "summarizer input over %s's window (%d tokens); now %d", model, size, self._learned[model]
                )
                if not asked.clamped:
                    asked.clamped = True
                    raise _Again from e
                raise _ModelFailed("input too large even with tool outputs cut", too_large=True) from e
            if is_retryable(e):
                raise _Transient(self._describe(e)) from e
            raise _ModelFailed(self._describe(e)) from e
        text, finish = _reply(response)
        if output != "markdown" and "{" in text:  # else a Markdown answer, read as one
            try:
                return await off_loop(self._items, model, request, text, finish in _CUT_OFF, usage)
            except schema.ReplyRefused as e:
                # Refused like any invalid summary, with the reason; the same model writes Markdown next.
                log.warning("summary by %s refused (%s); asking for Markdown", model, e)
                asked.markdown = True
                raise _Again from e
        problem = summary_problem(text, self._count(text), request)
        if finish in _CUT_OFF:
            if asked.shorter < CUT_OFF_RETRIES:
                # The model wrote past the budget: the same budget, a shorter summary asked.
                asked.shorter += 1
                log.info(
                    "summary by %s was cut off (finish_reason=%s); asking for a shorter one", model, finish
                )
                raise _Again
            problem = (f"the summary was cut off (finish_reason={finish})", False)
        if problem is None:
            text = text.strip()
            return SummaryResult(text, model, self._count(text), usage.event())
        reason, transient = problem
        raise _Transient(reason) if transient else _ModelFailed(reason)

    def _items(
        self, model: str, request: SummaryRequest, text: str, cut: bool, usage: _Usage
    ) -> SummaryResult:
        """The summary a JSON reply gives: its items checked against the turns they cite, applied to the
        current ones, fitted to the budget and rendered; raises :class:`schema.ReplyRefused`."""
        limits = schema.Limits.for_room(request.max_summary_tokens)
        data = schema.parse(text, cut=cut)
        blocks = transcript_blocks(request.messages)
        seqs = list(request.seqs) if len(request.seqs) == len(blocks) else list(range(1, len(blocks) + 1))
        current = [schema.Item.decode(raw) for raw in request.items]
        changes = schema.read_changes(data, blocks, seqs, current, limits)
        for refused, why in changes.refused:
            log.info("summary item by %s refused: %s (%r)", model, why, refused[:80])
        budget = request.max_summary_tokens
        if request.replaced_tokens > 0:
            budget = min(budget, request.replaced_tokens - 1)
        after = schema.apply(current, changes)
        if not request.folds:
            # An additive chunk holds what changed; the current items stay in their chunks, bytes and all.
            prior = set(request.items)
            after = [item for item in after if item.encode() not in prior]
        items, dropped = schema.fit(after, budget, self._count)
        if not items or (request.folds and not any(not item.resolved for item in items)):
            refused = f"; {len(changes.refused)} refused by the check" if changes.refused else ""
            raise schema.ReplyRefused(f"the reply holds no usable item{refused}")
        rendered = schema.render(items)
        problem = summary_problem(rendered, self._count(rendered), request)
        if problem is not None:
            raise schema.ReplyRefused(problem[0])
        return SummaryResult(
            rendered,
            model,
            self._count(rendered),
            usage.event(),
            items=tuple(item.encode() for item in items),
            refused=len(changes.refused),
            let_go=len(dropped),
        )

    async def _call(
        self,
        model: str,
        prompt: list[dict[str, str]],
        request: SummaryRequest,
        usage: _Usage,
        output: Output = "markdown",
    ) -> Any:
        """One LLM call, traced and measured (GenAI conventions); its usage is added to ``usage``."""
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
        # No exception events: a provider's message may quote the request (or the key, until _scrub).
        with tracing.span(f"chat {model}", attributes, kind=SpanKind.CLIENT, record_exception=False) as span:
            if tracing.capture_content:  # only when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true
                span.set_attribute("gen_ai.input.messages", json.dumps(prompt))
            usage.calls += 1
            started = time.perf_counter()
            try:
                response = await _litellm.load().acompletion(
                    **self._call_args(model, prompt, request, output)
                )
            except Exception as e:
                metrics.record_llm_call(model, time.perf_counter() - started, error=type(e).__name__)
                tracing.fail(span, e, record=False)
                raise
            duration = time.perf_counter() - started
            input_tokens, output_tokens, cost = usage.add(response)
            text, finish = _reply(response)
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": input_tokens,
                    "gen_ai.usage.output_tokens": output_tokens,
                    "gen_ai.response.finish_reasons": [finish] if finish else [],
                }
            )
            if getattr(response, "model", None):
                span.set_attribute("gen_ai.response.model", str(response.model))
            if tracing.capture_content:
                span.set_attribute(
                    "gen_ai.output.messages", json.dumps([{"role": "assistant", "content": text}])
                )
            metrics.record_llm_call(
                model, duration, input_tokens=input_tokens, output_tokens=output_tokens, cost=cost
            )
            return response

    def _call_args(
        self, model: str, prompt: list[dict[str, str]], request: SummaryRequest, output: Output = "markdown"
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if output in ("schema", "grammar"):
            extra["response_format"] = schema.response_format(
                schema.Limits.for_room(request.max_summary_tokens),
                grammar=output == "grammar",
                anchored=bool(request.items),
            )
        return {
            **extra,
            "model": model,
            "messages": prompt,
            "api_base": self.settings.api_base,
            "api_key": self._key,
            "timeout": self.settings.timeout_seconds,
            # The same limit as a Markdown summary's: the schema's counts and lengths are set to fit it.
            "max_tokens": request.max_summary_tokens,
            "temperature": self.settings.temperature,
            # Retries are ours (LiteLLM's and the provider SDK's are off), so backoff, fallbacks
            # and input limits stay in one place.
            "num_retries": 0,
            "max_retries": 0,
        }

    def _input_limit(self, model: str, request: SummaryRequest) -> int | None:
        """Prompt tokens the model accepts: the configured cap, its window minus the reply, what it said."""
        limits = [self.settings.max_input_tokens] if self.settings.max_input_tokens else []
        window = known_window(model)  # None for models the registry does not know
        if window is not None:
            limits.append(window - request.max_summary_tokens)
        if model in self._learned:
            limits.append(self._learned[model])
        return min(limits) if limits else None

    def _learn(
        self, model: str, overflow: OverflowInfo, size: int, request: SummaryRequest, system: str
    ) -> None:
        """Remember the prompt limit an overflow implies, in our token counter's units."""
        if overflow.max_tokens is not None:
            learned = overflow.max_tokens - request.max_summary_tokens
            if overflow.actual_tokens:
                learned = int(learned * size / overflow.actual_tokens)  # its tokenizer is not ours
        else:
            # No numbers (a bare 413, say): half the transcript is a guess that converges.
            frame = self._tokens(compose_prompt(request, system, []))
            learned = frame + (size - frame) // 2
        # A prompt of ``size`` tokens was refused, whatever the numbers claim.
        self._learned[model] = min(learned, size - 1, self._learned.get(model, size))

    def _prompt(
        self, request: SummaryRequest, system: str, *, clamped: bool, output: Output = "markdown"
    ) -> list[dict[str, str]]:
        """The prompt, with every long tool output cut to its head and tail when ``clamped``."""
        messages = [clamp_tool_output(m) for m in request.messages] if clamped else request.messages
        return compose_prompt(
            request, system, transcript_blocks(messages), items=self._listing(request, output)
        )

    def _tokens(self, prompt: Sequence[Mapping[str, str]]) -> int:
        return sum(self._count(m["content"]) + _PER_MESSAGE_TOKENS for m in prompt)

    def _describe(self, error: BaseException) -> str:
        text = str(error)
        if type(error).__name__ not in text:
            text = f"{type(error).__name__}: {text}"
        return self._redact(text)[:500]

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _scrub(self, error: BaseException) -> None:
        """Remove the API key from a failed call's exception chain before ours chains it."""
        if not self._secret:
            return
        seen: set[int] = set()
        current: BaseException | None = error
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            current.args = tuple(self._redact(a) if isinstance(a, str) else a for a in current.args)
            message = getattr(current, "message", None)
            if isinstance(message, str):
                with contextlib.suppress(AttributeError):  # a read-only property elsewhere
                    current.message = self._redact(message)  # type: ignore[attr-defined]  # LiteLLM's errors have it
            current = current.__cause__ or current.__context__


def _reply(response: Any) -> tuple[str, str | None]:
    try:
        choice = response.choices[0]
        text = choice.message.content
        finish = choice.finish_reason
    except (AttributeError, IndexError, TypeError):
        return "", None
    return (text if isinstance(text, str) else ""), (str(finish) if finish else None)
