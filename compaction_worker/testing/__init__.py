"""Test helpers, for this project's tests and for users' own: fakes and builders.

- :class:`FakeLLMServer`: an OpenAI-compatible endpoint on 127.0.0.1 that LiteLLM calls over
  real HTTP; it summarizes deterministically (:func:`default_summary`) or fails as told,
  with any provider's real context-overflow error (:func:`provider_overflow_error`).
- :func:`turn_payload`: a valid ``conversation.turn`` event as JSON; :func:`turn_event`, the
  same as a ``TurnEvent``, and :func:`turn_bytes`, as a Kafka record's value.
- :class:`Chat`: a stored conversation built message by message, and :func:`summary_chunk`,
  an earlier summary in it: what the pipeline's stages take.
- :class:`WordCounter`: a token counter whose numbers a test can work out by hand.
"""

from compaction_worker.testing.builders import (
    Chat,
    WordCounter,
    summary_chunk,
    turn_bytes,
    turn_event,
    turn_payload,
)
from compaction_worker.testing.fake_llm import FakeLLMServer, Responder
from compaction_worker.testing.replies import OVERFLOW_PROVIDERS, default_summary, provider_overflow_error

__all__ = [
    "OVERFLOW_PROVIDERS",
    "Chat",
    "FakeLLMServer",
    "Responder",
    "WordCounter",
    "default_summary",
    "provider_overflow_error",
    "summary_chunk",
    "turn_bytes",
    "turn_event",
    "turn_payload",
]
