"""Summaries of conversation spans: the only module that calls an LLM.

:class:`LiteLLMSummarizer` asks any LiteLLM model for a structured summary (the prompt is
built in :mod:`compaction_worker.prompts`), with its own retries, fallback models, and an
escalation that shrinks its input when the summarizer's own window is too small.
:class:`~compaction_worker.extractive.ExtractiveSummarizer` writes the same sections
without an LLM. Both return summaries that passed :func:`validate_summary`: an empty,
error-text, cut-off or oversized summary never leaves them (DESIGN invariant 6).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from compaction_worker._litellm import litellm
from compaction_worker.errors import SummarizerError
from compaction_worker.events import LlmUsage
from compaction_worker.overflow import OverflowInfo, detect_overflow
from compaction_worker.prompts import (
    clamp_tool_output,
    compose_prompt,
    default_instructions,
    drop_middle,
    omitted_notice,
    transcript_blocks,
)
from compaction_worker.settings import SummarizerSettings

__all__ = [
    "ERROR_TEXT_PATTERNS",
    "CountTokens",
    "LiteLLMSummarizer",
    "Summarizer",
    "SummaryRequest",
    "SummaryResult",
    "is_retryable",
    "looks_like_error_text",
    "make_summarizer",
    "validate_summary",
]

log = logging.getLogger(__name__)

CountTokens = Callable[[str], int]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """A span of a conversation to summarize, and the limits its summary must meet."""

    conversation_id: str
    messages: Sequence[Mapping[str, Any]]
    """The span: OpenAI-style message dicts, in order."""
    previous_summaries: Sequence[str] = ()
    """Earlier summaries folded into this one (recursive fold), oldest first."""
    max_summary_tokens: int = 2048
    replaced_tokens: int = 0
    """Tokens of what the summary replaces; a valid summary is strictly smaller."""
    conversation_model: str = ""
    ledger: Sequence[str] = ()
    """Artifact ledger items stored verbatim next to the summary (``"<kind>: <text>"``).

    A summary need not spend its budget repeating them; the LLM prompt does not show them
    (its instructions still ask for exact identifiers), the extractive summary skips them.
    """


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """A validated summary, who wrote it, its size, and what the LLM calls cost."""

    text: str
    model: str
    tokens: int
    usage: LlmUsage


class Summarizer(Protocol):
    """Turns a :class:`SummaryRequest` into a valid summary, or raises SummarizerError."""

    name: str
    """Shown in events and the CLI: a model string or ``extractive``."""

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Summarize the request's span; raises SummarizerError when no valid summary results."""
        ...


def make_summarizer(settings: SummarizerSettings, count_tokens: CountTokens) -> Summarizer:
    """The configured summarizer: LiteLLM with a model, the extractive one without."""
    if settings.model and settings.model.strip():
        return LiteLLMSummarizer(settings, count_tokens)
    # The extractive summarizer builds on this module's request and validation.
    from compaction_worker.extractive import ExtractiveSummarizer  # noqa: PLC0415  # a cycle at import time

    return ExtractiveSummarizer(count_tokens)


# --- validation ---------------------------------------------------------------------------

ERROR_TEXT_PATTERNS: Final[tuple[re.Pattern[str], ...]] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"^\W*error\b",
        r"^\W*(?:an? )?(?:unexpected |internal )?error (?:has )?occurred",
        r"^(?:i'?m|i am) sorry\b",
        r"^sorry\b",
        r"^(?:unfortunately,? )?i (?:cannot|can'?t|am unable|'m unable|was unable)\b",
        r"^as an ai\b",
        r"^\d{3} [a-z]",  # "429 Too Many Requests", "502 Bad Gateway"
        r"rate.?limit",
        r"too many requests",
        r"quota",
        r"context (?:length|window)",
        r"maximum context",
        r"internal server error",
        r"service unavailable|temporarily unavailable",
        r"bad gateway|gateway time-?out",
        r"overloaded",
        r"timed? ?out",
        r"invalid api key|unauthori[sz]ed",
        r"<html|<!doctype",
        r"\{\s*[\"']error[\"']\s*:",
    )
)
"""What an LLM or proxy error returned as reply content looks like (checked on short replies)."""

_ERROR_TEXT_MAX_CHARS: Final = 400
_MARKUP: Final = re.compile(r"^\s*(?:<!doctype html|<html|<\?xml)", re.IGNORECASE)
_HEADING: Final = re.compile(r"^#{1,6} \S", re.MULTILINE)


def looks_like_error_text(text: str) -> bool:
    """Whether a reply is an error message rather than a summary.

    Only a short, unstructured reply is judged by ``ERROR_TEXT_PATTERNS``: a real summary
    may well quote "rate limit exceeded" in its Errors section. An HTML page is an error
    whatever its length.
    """
    stripped = text.strip()
    if _MARKUP.match(stripped):
        return True
    if len(stripped) > _ERROR_TEXT_MAX_CHARS or _HEADING.search(stripped) or stripped.count("\n") > 3:
        return False
    return any(p.search(stripped) for p in ERROR_TEXT_PATTERNS)


def _problem(text: str, tokens: int, request: SummaryRequest) -> tuple[str, bool] | None:
    """What is wrong with a summary, and whether asking again could help; None if nothing."""
    if not text.strip():
        return "the summary is empty", True
    if looks_like_error_text(text):
        return f"the reply is an error text, not a summary: {text.strip()[:120]!r}", True
    if tokens > request.max_summary_tokens:
        return (
            f"the summary has {tokens} tokens, over its budget of {request.max_summary_tokens}",
            False,
        )
    if request.replaced_tokens > 0 and tokens >= request.replaced_tokens:
        return (
            f"the summary ({tokens} tokens) is not smaller than what it replaces "
            f"({request.replaced_tokens} tokens)"
        ), False
    return None


def validate_summary(text: str, tokens: int, request: SummaryRequest) -> None:
    """Raise SummarizerError when a summary is empty, an error text, too big, or not smaller."""
    problem = _problem(text, tokens, request)
    if problem is not None:
        raise SummarizerError(problem[0])


# --- the LLM summarizer -------------------------------------------------------------------

# Status codes worth asking again: the request was fine, the service was not.
_RETRYABLE_TYPES: Final = (
    litellm.exceptions.Timeout,
    litellm.exceptions.APIConnectionError,
    litellm.exceptions.RateLimitError,
    litellm.exceptions.InternalServerError,
    litellm.exceptions.ServiceUnavailableError,
    litellm.exceptions.BadGatewayError,
)
_FINAL_TYPES: Final = (
    litellm.exceptions.BadRequestError,  # includes ContextWindowExceededError, ContentPolicyViolationError
    litellm.exceptions.AuthenticationError,
    litellm.exceptions.PermissionDeniedError,
    litellm.exceptions.NotFoundError,
    litellm.exceptions.UnprocessableEntityError,
    litellm.exceptions.BudgetExceededError,
)
_CUT_OFF: Final = frozenset({"length", "max_tokens", "model_context_window_exceeded"})
_PER_MESSAGE_TOKENS: Final = 4


def is_retryable(error: BaseException) -> bool:
    """Whether a failed call is worth repeating: timeouts, connection errors, 429 and 5xx."""
    if isinstance(error, _FINAL_TYPES):
        return False
    if isinstance(error, _RETRYABLE_TYPES):
        return True
    status = getattr(error, "status_code", None)
    if isinstance(status, int):
        return status in (408, 409, 429) or status >= 500
    return isinstance(error, TimeoutError | ConnectionError)


class _ModelFailed(Exception):
    """One model gave up; the next fallback gets its turn."""


@dataclass(slots=True)
class _Usage:
    calls: int = 0
    prompt: int = 0
    completion: int = 0
    cost: float | None = None

    def add(self, response: Any) -> None:
        usage = getattr(response, "usage", None)
        self.prompt += int(getattr(usage, "prompt_tokens", 0) or 0)
        self.completion += int(getattr(usage, "completion_tokens", 0) or 0)
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:  # models without a price in LiteLLM's map raise; cost unknown
            cost = None
        if cost is not None:
            self.cost = (self.cost or 0.0) + float(cost)

    def event(self) -> LlmUsage:
        return LlmUsage(
            calls=self.calls,
            prompt_tokens=self.prompt,
            completion_tokens=self.completion,
            total_tokens=self.prompt + self.completion,
            cost_usd=self.cost,
        )


class LiteLLMSummarizer:
    """Summaries from any LiteLLM model, with retries, fallback models and input escalation.

    Each model is tried in turn (``settings.model``, then ``settings.fallback_models``).
    A retryable failure is asked again up to ``settings.max_retries`` times with
    exponential backoff and jitter; any other failure, or an invalid summary, moves on to
    the next model. When the summarizer's own input is too large (the model said so, or
    the prompt is over ``settings.max_input_tokens`` or the model's window), the input is
    shrunk: first every tool output is cut to its head and tail, then the middle of the
    transcript is dropped behind a marker; after that the model gives up.
    """

    def __init__(
        self,
        settings: SummarizerSettings,
        count_tokens: CountTokens,
        *,
        sleep: Sleep = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
    ) -> None:
        self.settings = settings
        self.name = settings.model or "extractive"
        self._count = count_tokens
        self._sleep = sleep
        self._jitter = jitter
        self._base = backoff_base
        self._cap = backoff_cap
        self._key = settings.api_key.get_secret_value() if settings.api_key else None
        # Redaction replaces the key wherever it appears; a placeholder key such as "fake"
        # or "none" would mangle ordinary words, and is no secret.
        self._secret = self._key if self._key and len(self._key) >= 8 else None

    def __repr__(self) -> str:
        return f"<LiteLLMSummarizer {self.name} fallbacks={self.settings.fallback_models}>"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Summarize with the first model that produces a valid summary."""
        primary = self.settings.model or ""
        if primary == "conversation":
            primary = request.conversation_model
        models = list(dict.fromkeys(m for m in (primary, *self.settings.fallback_models) if m))
        if not models:
            raise SummarizerError(
                "no summarizer model: 'conversation' was configured but the request names none"
            )
        system = self._instructions(request)
        usage = _Usage()
        failures: list[str] = []
        cause: BaseException | None = None
        for model in models:
            try:
                return await self._with_model(model, request, system, usage)
            except _ModelFailed as e:
                failures.append(f"{model}: {e}")
                cause = e.__cause__ or cause
        message = "no valid summary from " + "; ".join(failures)
        # The failed calls were paid for: the caller adds their usage to the compaction's.
        raise SummarizerError(self._redact(message), usage=usage.event() if usage.calls else None) from cause

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
        level, retries = 0, 0
        limit = self._input_limit(model, request)
        overflowed: list[dict[str, str]] | None = None  # the prompt the model last refused
        while True:
            prompt = self._escalated(request, system, level, limit)
            if prompt is None:
                raise _ModelFailed("not even one message of the transcript fits the summarizer's window")
            size = self._tokens(prompt)
            if level < 2 and (prompt == overflowed or (limit is not None and size > limit)):
                level += 1  # this level cannot help: shrink further before spending a call
                continue
            if limit is not None and size > limit:
                raise _ModelFailed(f"the summarizer's input ({size} tokens) does not fit its limit ({limit})")
            try:
                usage.calls += 1
                response: Any = await litellm.acompletion(**self._call_args(model, prompt, request))
            except Exception as e:
                overflow = detect_overflow(e)
                if overflow is not None and level < 2:
                    overflowed = prompt
                    limit = self._learned_limit(overflow, size, request, limit)
                    level += 1
                    log.info(
                        "summarizer input over %s's window; shrinking (level %d)",
                        model,
                        level,
                        extra={"conversation_id": request.conversation_id},
                    )
                    continue
                reason = "input too large even after shrinking" if overflow else self._describe(e)
                if overflow is None and is_retryable(e) and retries < self.settings.max_retries:
                    retries += 1
                    await self._backoff(model, retries, reason, request)
                    continue
                self._scrub(e)
                raise _ModelFailed(reason) from e
            usage.add(response)
            text, finish = _reply(response)
            problem = _problem(text, self._count(text), request)
            if finish in _CUT_OFF:
                problem = (f"the summary was cut off (finish_reason={finish})", False)
            if problem is None:
                text = text.strip()
                return SummaryResult(text, model, self._count(text), usage.event())
            reason, transient = problem
            if transient and retries < self.settings.max_retries:
                retries += 1
                await self._backoff(model, retries, reason, request)
                continue
            raise _ModelFailed(reason)

    def _call_args(self, model: str, prompt: list[dict[str, str]], request: SummaryRequest) -> dict[str, Any]:
        return {
            "model": model,
            "messages": prompt,
            "api_base": self.settings.api_base,
            "api_key": self._key,
            "timeout": self.settings.timeout_seconds,
            "max_tokens": request.max_summary_tokens,
            "temperature": self.settings.temperature,
            # Retries are ours (LiteLLM's and the provider SDK's are off), so backoff, fallbacks
            # and escalation stay in one place.
            "num_retries": 0,
            "max_retries": 0,
        }

    async def _backoff(self, model: str, attempt: int, reason: str, request: SummaryRequest) -> None:
        delay = min(self._cap, self._base * 2 ** (attempt - 1))
        delay *= 0.5 + self._jitter() / 2  # jitter keeps many workers from retrying in step
        log.warning(
            "summary by %s failed (%s); retry %d/%d in %.2fs",
            model,
            reason,
            attempt,
            self.settings.max_retries,
            delay,
            extra={"conversation_id": request.conversation_id},
        )
        await self._sleep(delay)

    def _input_limit(self, model: str, request: SummaryRequest) -> int | None:
        """Prompt tokens the model accepts: the configured cap, and its window minus the reply."""
        limits = [self.settings.max_input_tokens] if self.settings.max_input_tokens else []
        try:
            window = litellm.get_model_info(model).get("max_input_tokens")
        except Exception:  # models unknown to LiteLLM's registry have no known window
            window = None
        if isinstance(window, int) and window > 0:
            limits.append(window - request.max_summary_tokens)
        return min(limits) if limits else None

    def _learned_limit(
        self, overflow: OverflowInfo, size: int, request: SummaryRequest, limit: int | None
    ) -> int | None:
        """The limit the provider's numbers imply, in our token counter's units."""
        if overflow.max_tokens is None:
            return limit
        learned = overflow.max_tokens - request.max_summary_tokens
        if overflow.actual_tokens:
            learned = int(learned * size / overflow.actual_tokens)  # its tokenizer is not ours
        return min(learned, limit) if limit is not None else learned

    def _escalated(
        self, request: SummaryRequest, system: str, level: int, limit: int | None
    ) -> list[dict[str, str]] | None:
        """The prompt at an escalation level; None when nothing of the transcript fits."""
        messages = request.messages if level == 0 else [clamp_tool_output(m) for m in request.messages]
        blocks = transcript_blocks(messages)
        if level < 2:
            return compose_prompt(request, system, blocks)
        full = self._tokens(compose_prompt(request, system, blocks))
        frame = self._tokens(compose_prompt(request, system, [omitted_notice(len(blocks))]))
        # A little headroom: token counts of blocks do not add up exactly to the whole.
        budget = int((limit if limit is not None else full // 2) * 0.97) - frame
        kept = drop_middle(blocks, [self._count(b) + 2 for b in blocks], budget)
        return compose_prompt(request, system, kept) if kept else None

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
