"""Turn fingerprints (compaction_worker.contracts.fingerprints): what they digest, and the older digest."""

from __future__ import annotations

from compaction_worker.contracts.events import TurnEvent
from compaction_worker.contracts.fingerprints import fingerprints, legacy_fingerprint, turn_fingerprint

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
LEGACY = "f5d82c76d44da3551bfaabe17e5ab5a2"
"""What runtime/prepare.py's turn_fingerprint gave for TURN at 68d6bac (computed from that commit's code)."""


def test_the_stored_texts_give_the_fingerprint_the_event_gives() -> None:
    event = TurnEvent.model_validate(TURN)

    assert turn_fingerprint(event, [m.to_json() for m in event.messages]) == turn_fingerprint(event)


def test_message_boundaries_count() -> None:
    """Two messages are not one message holding both texts."""
    one = TurnEvent.model_validate({**TURN, "messages": [{"role": "user", "content": "ab"}]})
    texts = [m.to_json() for m in one.messages]

    assert turn_fingerprint(one, texts) != turn_fingerprint(one, [texts[0][:10], texts[0][10:]])


def test_the_older_digest_is_the_one_releases_before_2026_11_stored() -> None:
    """Pinned: this value was stored by those releases for this turn (sorted-key JSON of the content)."""
    event = TurnEvent.model_validate(TURN)

    assert legacy_fingerprint(event) == LEGACY
    assert fingerprints(event) == {turn_fingerprint(event), LEGACY}
