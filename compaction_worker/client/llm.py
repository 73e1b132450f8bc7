"""One model call through LiteLLM on the effective history, recovering from a context overflow.

:func:`complete` is what an agent loop calls instead of ``litellm.acompletion``: it sends
the stored effective history plus the turn's new messages; when the provider says the
prompt does not fit, it asks the worker for a reactive compaction with the provider's own
text, waits for it to land and retries once; when the call succeeds it publishes the turn.

With ``recall=True`` it also gives the model the ``recall`` tool (recall/tools.py) and
answers the model's recall calls itself, calling again with the answers, a bounded number
of rounds: an agent gets recall of what compaction took out in one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from compaction_worker import _litellm
from compaction_worker.budget.overflow import detect_overflow
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import TurnEvent, Usage
from compaction_worker.errors import ConversationNotFound
from compaction_worker.formats import tool_call
from compaction_worker.recall.tools import OPENAI_TOOL, TOOL_NAME, recall_calls, tool_result
from compaction_worker.retry import RetryPolicy

__all__ = ["assistant_message", "complete"]

# CompactionRequest.error's limit; the numbers a provider states come first in its text.
_MAX_ERROR_CHARS = 20_000
_AFTER_COMPACTION = RetryPolicy(2, base_seconds=0.0, cap_seconds=0.0)
"""A call, and once more after the reactive compaction its overflow asked for (no wait: it has landed)."""


async def complete(
    client: Client,
    conversation_id: str,
    *,
    model: str,
    messages: Sequence[Mapping[str, Any]] | None = None,
    compaction_timeout: float = 120.0,
    recall: bool = False,
    recall_rounds: int = 3,
    **litellm_kwargs: Any,
) -> Any:
    """Call ``model`` on the effective history plus ``messages`` (this turn's new ones); publish the turn.

    On a context overflow (:func:`~compaction_worker.budget.overflow.detect_overflow`) it
    requests a reactive compaction, waits for it (at most ``compaction_timeout`` seconds)
    and retries once; a second overflow is raised. Returns LiteLLM's response unchanged.

    With ``recall=True`` the ``recall`` tool joins ``tools=`` and each of the model's recall
    calls is answered here (:meth:`Client.recall`) and the model called again, at most
    ``recall_rounds`` times; the turn published holds every call and answer. The response
    returned may still name recall calls (answered already: a runtime skips them) beside
    its own tools' calls, which are the runtime's to answer.
    """
    litellm = _litellm.load()
    new = [dict(m) for m in messages or ()]
    if recall:
        tools = list(litellm_kwargs.get("tools") or ())
        if not any(_tool_name(t) == TOOL_NAME for t in tools):
            litellm_kwargs["tools"] = [*tools, OPENAI_TOOL]
    # The previous turn, or a compaction it set off, may not be stored yet.
    await client.wait_for(conversation_id, timeout=compaction_timeout)
    history = await _history(client, conversation_id)

    async def compacted(error: BaseException, _failures: int) -> None:
        """The reactive compaction an overflow asks for, landed, before the call is made again."""
        nonlocal history
        seq = await client.next_turn_seq(conversation_id)
        await client.request_compaction(conversation_id, seq, model, error=str(error)[:_MAX_ERROR_CHARS])
        await client.wait_for(conversation_id, timeout=compaction_timeout)
        history = await _history(client, conversation_id)

    rounds = 0
    while True:
        response = await _AFTER_COMPACTION.run(
            lambda: litellm.acompletion(model=model, messages=[*history, *new], **litellm_kwargs),
            retry_if=lambda error: detect_overflow(error) is not None,
            on_retry=compacted,
        )
        reply = assistant_message(response)
        new.append(reply)
        calls = recall_calls(reply.get("tool_calls") or ()) if recall else []
        for call in calls:
            if call.error:
                text = json.dumps({"error": call.error})
            else:
                text = tool_result(await client.recall(conversation_id, call.query, limit=call.limit))
            new.append({"role": "tool", "tool_call_id": call.id, "content": text})
        rounds += 1
        # Another call only when the model asked for nothing but recall (its other calls are
        # the runtime's), and not past the bound.
        if not calls or len(calls) < len(reply["tool_calls"]) or rounds > recall_rounds:
            break
    event = TurnEvent.model_validate(
        {
            "conversation_id": conversation_id,
            "turn_seq": 1,  # drawn below, once the event is known valid: a drawn seq must be published
            "model": model,
            "messages": new,
            "usage": _usage(response),
        }
    )
    seq = await client.next_turn_seq(conversation_id)
    await client.publish_turn(event.model_copy(update={"turn_seq": seq}))
    return response


async def _history(client: Client, conversation_id: str) -> list[dict[str, Any]]:
    """The effective history; none before the conversation's first turn is stored."""
    try:
        return await client.messages(conversation_id)
    except ConversationNotFound:
        return []


def _tool_name(tool: Mapping[str, Any]) -> str | None:
    """A tool's name in OpenAI's shape (``function.name``) or a flat one (``name``)."""
    function = tool.get("function")
    return function.get("name") if isinstance(function, Mapping) else tool.get("name")


def assistant_message(response: Any) -> dict[str, Any]:
    """The first choice's message of a LiteLLM response as a stored chat message, tool calls included."""
    message = response.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        out["tool_calls"] = [tool_call(c.id, c.function.name, c.function.arguments or "") for c in calls]
    return out


def _usage(response: Any) -> Usage | None:
    usage = getattr(response, "usage", None)
    prompt = getattr(usage, "prompt_tokens", None)
    if not isinstance(prompt, int):
        return None
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=getattr(usage, "completion_tokens", None),
        total_tokens=getattr(usage, "total_tokens", None),
    )
