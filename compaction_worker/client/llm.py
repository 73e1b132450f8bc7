"""One model call through LiteLLM on the effective history, recovering from a context overflow.

:func:`complete` is what an agent loop calls instead of ``litellm.acompletion``: it sends
the stored effective history plus the turn's new messages; when the provider says the
prompt does not fit, it asks the worker for a reactive compaction with the provider's own
text, waits for it to land and retries once; when the call succeeds it publishes the turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compaction_worker import _litellm
from compaction_worker.budget.overflow import detect_overflow
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import TurnEvent, Usage

__all__ = ["assistant_message", "complete"]

# CompactionRequest.error's limit; the numbers a provider states come first in its text.
_MAX_ERROR_CHARS = 20_000


async def complete(
    client: Client,
    conversation_id: str,
    *,
    model: str,
    messages: Sequence[Mapping[str, Any]] | None = None,
    compaction_timeout: float = 120.0,
    **litellm_kwargs: Any,
) -> Any:
    """Call ``model`` on the effective history plus ``messages`` (this turn's new ones); publish the turn.

    On a context overflow (:func:`~compaction_worker.budget.overflow.detect_overflow`) it
    requests a reactive compaction, waits for it (at most ``compaction_timeout`` seconds)
    and retries once; a second overflow is raised. Returns LiteLLM's response unchanged.
    """
    litellm = _litellm.load()
    new = [dict(m) for m in messages or ()]
    # The previous turn, or a compaction it set off, may not be stored yet.
    await client.wait_for(conversation_id, timeout=compaction_timeout)
    history = await client.messages(conversation_id)
    try:
        response = await litellm.acompletion(model=model, messages=[*history, *new], **litellm_kwargs)
    except Exception as error:
        if detect_overflow(error) is None:
            raise
        seq = await client.next_turn_seq(conversation_id)
        await client.request_compaction(conversation_id, seq, model, error=str(error)[:_MAX_ERROR_CHARS])
        await client.wait_for(conversation_id, timeout=compaction_timeout)
        history = await client.messages(conversation_id)
        response = await litellm.acompletion(model=model, messages=[*history, *new], **litellm_kwargs)
    event = TurnEvent.model_validate(
        {
            "conversation_id": conversation_id,
            "turn_seq": 1,  # drawn below, once the event is known valid: a drawn seq must be published
            "model": model,
            "messages": [*new, assistant_message(response)],
            "usage": _usage(response),
        }
    )
    seq = await client.next_turn_seq(conversation_id)
    await client.publish_turn(event.model_copy(update={"turn_seq": seq}))
    return response


def assistant_message(response: Any) -> dict[str, Any]:
    """The first choice's message of a LiteLLM response as a stored chat message, tool calls included."""
    message = response.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments or ""},
            }
            for call in calls
        ]
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
