"""Message-format adapters: OpenAI chat, Responses items, Anthropic Messages, Gemini contents
and LangChain messages in and out of the stored form (OpenAI chat messages), losing nothing.

Each module has ``to_openai`` (its format to stored messages) and ``from_openai`` (back).
What chat form cannot hold rides in the private ``native`` field that rendering to chat
form strips; :mod:`compaction_worker.formats.rendering` renders the effective history in a
runtime's own format with it (``Client.messages(cid, format=...)``).
"""

from compaction_worker.formats import anthropic, gemini, langchain, openai_chat, responses
from compaction_worker.formats._common import NATIVE, FormatError, tool_call
from compaction_worker.formats.anthropic import AnthropicMessages
from compaction_worker.formats.gemini import GeminiContents

__all__ = [
    "NATIVE",
    "AnthropicMessages",
    "FormatError",
    "GeminiContents",
    "anthropic",
    "gemini",
    "langchain",
    "openai_chat",
    "responses",
    "tool_call",
]
