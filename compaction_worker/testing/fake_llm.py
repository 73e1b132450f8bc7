"""An OpenAI-compatible LLM server for tests, speaking real HTTP on 127.0.0.1.

LiteLLM's whole client path (request building, response parsing, exception mapping) runs
exactly as in production::

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
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Self

from aiohttp import web

from compaction_worker.contracts.history import text_of
from compaction_worker.testing.replies import default_summary, provider_overflow_error

__all__ = ["FakeLLMServer", "Responder"]

Responder = Callable[[dict[str, Any]], str | dict[str, Any]]
"""Makes the reply from a request body (see :meth:`FakeLLMServer.set_responder`): its text, or an
assistant message (``content`` and ``tool_calls``, OpenAI's shape) for a reply that calls tools; a
``finish_reason`` key in it (``"length"``: cut at the limit) is the choice's, not the message's."""


def _error_body(message: str, type_: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": None}}


_Failure = tuple[int, dict[str, Any] | str]
"""A queued failure: the HTTP status and the body (JSON, or text if a str)."""


def _prompt_chars(body: dict[str, Any]) -> int:
    return sum(len(text_of(m)) for m in body.get("messages") or [] if isinstance(m, dict))


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
            self._failures.extend([(status, body)] * n)

    def overflow_next(
        self, n: int, provider: str = "openai", actual: int = 9000, maximum: int = 8192
    ) -> None:
        """Answer the next ``n`` requests with ``provider``'s real context-overflow error."""
        status, body = provider_overflow_error(provider, actual, maximum)
        with self._lock:
            self._failures.extend([(status, body)] * n)

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

    def __exit__(self, *_exc: object) -> None:
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
            status, error = failure
            if isinstance(error, str):
                return web.Response(status=status, text=error)
            return web.json_response(error, status=status)
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
        message: dict[str, Any] | None = None
        finish: str | None = None
        if responder is not None:
            answer = responder(body)
            message = dict(answer) if isinstance(answer, dict) else None
            if message is not None:
                finish = message.pop("finish_reason", None)  # e.g. "length": a reply cut at its limit
            text = answer if isinstance(answer, str) else str(answer.get("content") or "")
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
                        "message": {"role": "assistant", "content": text, **(message or {})},
                        "finish_reason": finish
                        or ("tool_calls" if message and message.get("tool_calls") else "stop"),
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
