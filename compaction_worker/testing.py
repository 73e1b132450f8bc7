"""Fakes for tests: an OpenAI-compatible LLM server and a builder for turn payloads.

:class:`FakeLLMServer` speaks real HTTP, so LiteLLM's whole client path (request
building, response parsing, exception mapping) runs exactly as in production::

    with FakeLLMServer() as llm:
        llm.overflow_next(1)
        await litellm.acompletion(
            model="openai/fake-summarizer", messages=[...], api_base=llm.url, api_key="fake"
        )  # raises litellm.ContextWindowExceededError

It serves from a background thread with its own event loop, so sync tests, async tests
and a worker running in the test's own loop can all use it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from compaction_worker.contracts.events import TurnEvent

__all__ = [
    "OVERFLOW_PROVIDERS",
    "FakeLLMServer",
    "default_summary",
    "provider_overflow_error",
    "turn_payload",
]

Responder = Callable[[dict[str, Any]], str]

# --- provider errors -----------------------------------------------------------------


def _openai_overflow(actual: int, maximum: int) -> tuple[int, dict[str, Any]]:
    return 400, {
        "error": {
            "message": (
                f"This model's maximum context length is {maximum} tokens. However, your "
                f"messages resulted in {actual} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def _anthropic_overflow(actual: int, maximum: int) -> tuple[int, dict[str, Any]]:
    return 400, {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {actual} tokens > {maximum} maximum",
        },
    }


def _gemini_overflow(actual: int, maximum: int) -> tuple[int, dict[str, Any]]:
    return 400, {
        "error": {
            "code": 400,
            "message": (
                f"The input token count ({actual}) exceeds the maximum number of tokens allowed ({maximum})."
            ),
            "status": "INVALID_ARGUMENT",
        }
    }


OVERFLOW_PROVIDERS: dict[str, Callable[[int, int], tuple[int, dict[str, Any]]]] = {
    "openai": _openai_overflow,
    "azure": _openai_overflow,  # Azure OpenAI sends OpenAI's body unchanged
    "anthropic": _anthropic_overflow,
    "gemini": _gemini_overflow,
}
"""Context-overflow errors as each provider sends them: ``(actual, maximum) -> (status, body)``."""


def provider_overflow_error(
    provider: str = "openai", actual: int = 9000, maximum: int = 8192
) -> tuple[int, dict[str, Any]]:
    """Return the HTTP status and JSON body of ``provider``'s context-overflow error."""
    try:
        build = OVERFLOW_PROVIDERS[provider]
    except KeyError:
        known = ", ".join(sorted(OVERFLOW_PROVIDERS))
        raise ValueError(f"unknown provider {provider!r}; known: {known}") from None
    return build(actual, maximum)


def _error_body(message: str, type_: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": None}}


# --- the default reply ---------------------------------------------------------------

_SNIPPET_WORDS = 12
_MIN_SNIPPET_WORDS = 4
_MIN_BUDGET_WORDS = 32
_SUMMARY_WORDS = 300
_ROLE_HEADER = re.compile(
    r"^[\s\-*#>\[(<\d.:]*(?:message\s+role\s*=\s*[\"']?)?\**"
    r"(?P<role>system|user|assistant|tool|function)\b"
    r"(?:[^\n:]{0,40}?[:\]>)]+|\s*$)[ \t]*",
    re.IGNORECASE,
)
_FENCED_TAG = re.compile(r"<(?P<tag>[A-Za-z_][\w-]*)[^>]*>(?P<body>.*?)</(?P=tag)>", re.DOTALL)
_FENCED_TICKS = re.compile(r"```[^\n]*\n(?P<body>.*?)```", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def _text_of(content: Any) -> str:
    """The text of a message content: a string or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _transcript_of(body: dict[str, Any]) -> str:
    """The transcript a summarizer sent: the last user message, inside its fence if it has one."""
    messages = body.get("messages") or []
    text = next(
        (
            _text_of(m.get("content"))
            for m in reversed(messages)
            if isinstance(m, dict) and m.get("role") == "user"
        ),
        "",
    )
    # Summarizers fence the transcript as untrusted data; the instructions around it are
    # not part of what is summarized.
    fenced = [m.group("body") for m in _FENCED_TAG.finditer(text)]
    fenced += [m.group("body") for m in _FENCED_TICKS.finditer(text)]
    return max(fenced, key=len) if fenced else text


def _entries(transcript: str) -> list[tuple[str | None, str]]:
    """Split a transcript into ``(role, text)`` entries by JSON, role headers or paragraphs."""
    stripped = transcript.strip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, list) and all(isinstance(m, dict) for m in data):
            return [(m.get("role"), _text_of(m.get("content"))) for m in data]
    entries: list[tuple[str | None, str]] = []
    role: str | None = None
    lines: list[str] = []
    found_header = False
    for line in stripped.splitlines():
        header = _ROLE_HEADER.match(line)
        if header:
            if found_header or any(s.strip() for s in lines):
                entries.append((role, "\n".join(lines)))
            found_header = True
            role, lines = header.group("role").lower(), [line[header.end() :]]
        else:
            lines.append(line)
    entries.append((role, "\n".join(lines)))
    if not found_header:
        paragraphs = [p for p in re.split(r"\n\s*\n", stripped) if p.strip()]
        if len(paragraphs) <= 1:
            paragraphs = stripped.splitlines()
        entries = [(None, p) for p in paragraphs]
    return [(r, t) for r, t in entries if t.strip()]


def _snippet(text: str) -> str:
    """The first sentence of ``text`` (longer if that is under 4 words), at most 12 words."""
    words: list[str] = []
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        words += sentence.split()
        if len(words) >= _MIN_SNIPPET_WORDS:
            break
    if len(words) > _SNIPPET_WORDS:
        return " ".join(words[:_SNIPPET_WORDS]) + " ..."
    return " ".join(words)


def _bullet(role: str | None, text: str) -> str:
    return f"- {role}: {_snippet(text)}" if role else f"- {_snippet(text)}"


def default_summary(body: dict[str, Any]) -> str:
    """The fake's deterministic summary of a chat-completions request body.

    One bullet (first sentence, at most 12 words) per message found in the transcript,
    under the headings a real summary has; at most ~300 words and at most half the
    transcript's words (but 32 at least), so a summary of any transcript worth
    compacting is clearly shorter than what it covers.
    """
    transcript = _transcript_of(body)
    entries = _entries(transcript)
    if not entries:
        return "## Current state\n- (empty transcript)"
    budget = min(_SUMMARY_WORDS, max(_MIN_BUDGET_WORDS, len(transcript.split()) // 2))
    goal_index = next((i for i, (role, _) in enumerate(entries) if role == "user"), 0)
    last_index = len(entries) - 1
    goal = _bullet(*entries[goal_index])
    nxt = f"- Continue from: {_snippet(entries[last_index][1])}" if last_index != goal_index else ""
    used = len(goal.split()) + len(nxt.split())
    state: list[str] = []
    middle = [e for i, e in enumerate(entries) if i not in (goal_index, last_index)]
    for n, entry in enumerate(middle):
        bullet = _bullet(*entry)
        if used + len(bullet.split()) > budget:
            state.append(f"- ... and {len(middle) - n} more messages")
            break
        state.append(bullet)
        used += len(bullet.split())
    parts = ["## Goals and constraints", goal, "## Current state"]
    parts += state or ["- (see next steps)"]
    if nxt:
        parts += ["## Next steps", nxt]
    return "\n".join(parts)


# --- the server ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Failure:
    status: int
    body: dict[str, Any] | str


def _prompt_chars(body: dict[str, Any]) -> int:
    return sum(len(_text_of(m.get("content"))) for m in body.get("messages") or [] if isinstance(m, dict))


class FakeLLMServer:
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint on 127.0.0.1 for tests.

    Use ``model="openai/<anything>"``, ``api_base=server.url`` and ``api_key="fake"``.
    Replies are the :func:`default_summary` of the request unless :meth:`set_reply` or
    :meth:`set_responder` say otherwise; :meth:`fail_next` and :meth:`overflow_next`
    queue failures, consumed one per request in the order they were queued. Note that
    LiteLLM's OpenAI client retries 5xx and 429 answers itself (pass ``max_retries=0``
    or queue enough failures).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._delay = 0.0
        self._reply: str | None = None
        self._responder: Responder | None = None
        self._failures: deque[_Failure] = deque()
        self._counter = 0
        self._in_flight = 0
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    # -- configuration (thread-safe; takes effect for the next request) ---------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, for ``api_base=``."""
        if self._port is None:
            raise RuntimeError("FakeLLMServer is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of every request body received so far, in order."""
        with self._lock:
            return list(self._requests)

    @property
    def in_flight(self) -> int:
        """How many requests are being answered right now (received, reply not yet sent).

        With :meth:`set_delay`, this shows whether an LLM call is under way, e.g. to kill a
        worker in the middle of one. A client that goes away does not end its request early:
        it counts until its delay is over.
        """
        with self._lock:
            return self._in_flight

    def set_delay(self, seconds: float) -> None:
        """Make every response wait ``seconds`` (without blocking other requests)."""
        with self._lock:
            self._delay = max(0.0, seconds)

    def set_reply(self, text: str | None) -> None:
        """Reply with ``text``; ``None`` restores the default summary."""
        with self._lock:
            self._reply = text

    def set_responder(self, fn: Responder | None) -> None:
        """Reply with ``fn(request_body)``; takes precedence over :meth:`set_reply`."""
        with self._lock:
            self._responder = fn

    def fail_next(self, n: int, status: int = 500, body: dict[str, Any] | str | None = None) -> None:
        """Answer the next ``n`` requests with ``status`` and ``body`` (JSON, or text if a str)."""
        if body is None:
            body = _error_body(f"FakeLLMServer: injected failure (HTTP {status})", "server_error")
        with self._lock:
            self._failures.extend(_Failure(status, body) for _ in range(n))

    def overflow_next(
        self, n: int, provider: str = "openai", actual: int = 9000, maximum: int = 8192
    ) -> None:
        """Answer the next ``n`` requests with ``provider``'s real context-overflow error."""
        status, body = provider_overflow_error(provider, actual, maximum)
        with self._lock:
            self._failures.extend(_Failure(status, body) for _ in range(n))

    def reset(self) -> None:
        """Forget recorded requests, delay, reply, responder and queued failures."""
        with self._lock:
            self._requests.clear()
            self._delay = 0.0
            self._reply = None
            self._responder = None
            self._failures.clear()

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start serving on a free port; returns once the server accepts requests."""
        if self._thread is not None:
            return
        started = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(started, errors), name="fake-llm-server", daemon=True
        )
        self._thread.start()
        started.wait()
        if errors:
            self._thread.join()
            self._thread = None
            raise RuntimeError("FakeLLMServer failed to start") from errors[0]

    def stop(self) -> None:
        """Stop serving and join the server thread."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None:
            # The loop is gone already if the server thread died on its own.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        thread.join()
        self._thread = self._loop = self._stopping = None
        self._port = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self._port is not None else "stopped"
        return f"<FakeLLMServer {where} requests={len(self._requests)}>"

    def _run(self, started: threading.Event, errors: list[BaseException]) -> None:
        try:
            asyncio.run(self._serve(started))
        except BaseException as e:  # reported to start(), which re-raises it
            errors.append(e)
        finally:
            started.set()

    async def _serve(self, started: threading.Event) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path in ("/v1/chat/completions", "/chat/completions"):
            app.router.add_post(path, self._chat_completions)
        # In-flight delayed replies must not hold up stop() for long.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._port = int(runner.addresses[0][1])
            self._loop = asyncio.get_running_loop()
            self._stopping = asyncio.Event()
            started.set()
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    # -- the endpoint -----------------------------------------------------------------

    async def _chat_completions(self, request: web.Request) -> web.Response:
        with self._lock:
            self._in_flight += 1
        try:
            return await self._answer(request)
        finally:
            with self._lock:
                self._in_flight -= 1

    async def _answer(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self._lock:
            self._requests.append(
                body if isinstance(body, dict) else {"_invalid_body": raw.decode(errors="replace")}
            )
            delay = self._delay
            failure = self._failures.popleft() if self._failures else None
            reply, responder = self._reply, self._responder
            self._counter += 1
            number = self._counter
        if delay and self._stopping is not None:
            # Waiting on the stop event instead of sleeping lets stop() end delayed calls.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return web.json_response(_error_body("FakeLLMServer is stopping", "server_error"), status=503)
        if failure is not None:
            if isinstance(failure.body, str):
                return web.Response(status=failure.status, text=failure.body)
            return web.json_response(failure.body, status=failure.status)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return web.json_response(
                _error_body("the body must be a JSON object with a 'messages' list", "invalid_request_error"),
                status=400,
            )
        if body.get("stream"):
            return web.json_response(
                _error_body(
                    "FakeLLMServer does not support stream=true; call with stream=False",
                    "invalid_request_error",
                    "stream",
                ),
                status=400,
            )
        if responder is not None:
            text = responder(body)
        elif reply is not None:
            text = reply
        else:
            text = default_summary(body)
        prompt_tokens = max(1, math.ceil(_prompt_chars(body) / 4))
        completion_tokens = max(1, math.ceil(len(text) / 4))
        return web.json_response(
            {
                "id": f"chatcmpl-fake-{number}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": str(body.get("model", "fake")),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
                "system_fingerprint": None,
            }
        )


# --- payloads --------------------------------------------------------------------------


def turn_payload(
    conversation_id: str,
    turn_seq: int,
    messages: list[dict[str, Any]],
    model: str = "gpt-4o-mini",
    **fields: Any,
) -> dict[str, Any]:
    """Build the JSON dict of a ``conversation.turn`` event, validated by ``TurnEvent``.

    ``fields`` are any other :class:`~compaction_worker.contracts.events.TurnEvent` fields
    (``system_prompt``, ``tools``, ``usage``, ``compaction``, ``event_id``, ...).
    Raises pydantic's ``ValidationError`` when the event would be invalid, and TypeError
    for a field name TurnEvent does not have.
    """
    # TurnEvent ignores unknown fields (forward compatibility), which would turn a typo
    # here into a silently missing field.
    unknown = sorted(set(fields) - set(TurnEvent.model_fields))
    if unknown:
        raise TypeError(f"turn_payload() got fields TurnEvent does not have: {', '.join(unknown)}")
    event = TurnEvent.model_validate(
        {
            "conversation_id": conversation_id,
            "turn_seq": turn_seq,
            "model": model,
            "messages": messages,
            **fields,
        }
    )
    return event.model_dump(mode="json", exclude_none=True)
