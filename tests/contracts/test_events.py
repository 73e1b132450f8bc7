"""The event contracts' behaviour beyond their schemas: a turn's fingerprint (what it digests)."""

from __future__ import annotations

from compaction_worker.contracts.events import TurnEvent

TURN = {
    "conversation_id": "c",
    "turn_seq": 3,
    "model": "openrouter/openai/gpt-4.1",
    "messages": [
        {"role": "user", "content": "Fix `src/app.py` — it fails with KeyError 'id'."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "def f(event): return event['id']"},
    ],
    "usage": {"prompt_tokens": 1200, "completion_tokens": 40},
}


def test_the_stored_texts_give_the_fingerprint_the_event_gives() -> None:
    event = TurnEvent.model_validate(TURN)

    assert event.fingerprint([m.to_json() for m in event.messages]) == event.fingerprint()


def test_message_boundaries_count() -> None:
    """Two messages are not one message holding both texts."""
    one = TurnEvent.model_validate({**TURN, "messages": [{"role": "user", "content": "ab"}]})
    texts = [m.to_json() for m in one.messages]

    assert one.fingerprint(texts) != one.fingerprint([texts[0][:10], texts[0][10:]])
