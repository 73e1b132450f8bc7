"""Context-overflow detection against the error texts providers really send.

Every text is quoted from a real report, with its source: the overflows in
``tests/budget/overflow_corpus.py``, and below the look-alikes that compaction cannot fix
(rate limits, quotas, output caps).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from compaction_worker._litellm import litellm
from compaction_worker.budget.overflow import OverflowInfo, detect_overflow
from compaction_worker.testing import FakeLLMServer
from compaction_worker.testing.replies import OVERFLOW_PROVIDERS
from tests.budget.overflow_corpus import OVERFLOWS

# (source, text): errors that must not be read as overflows.
NOT_OVERFLOWS: list[tuple[str, str]] = [
    # github.com/FoundationAgents/MetaGPT/issues/523: a tokens-per-minute limit
    (
        "openai-tpm",
        "openai.error.RateLimitError: Rate limit reached for gpt-4 in organization org-x on tokens "
        "per min (TPM): Limit 10000, Used 8554, Requested 3082. Please try again in 9.816s. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
    ),
    # github.com/TheR1D/shell_gpt/issues/653: "Request too large" for the TPM limit, 429
    (
        "openai-request-too-large-tpm",
        "RateLimitError: Error code: 429 - {'error': {'message': 'Request too large for gpt-4o in "
        "organization org-x on tokens per min (TPM): Limit 30000, Requested 31538. The input or "
        "output tokens must be reduced in order to run successfully.', 'type': 'tokens', 'param': "
        "None, 'code': 'rate_limit_exceeded'}}",
    ),
    # github.com/stagewise-io/stagewise/issues/927: Anthropic's input-tokens-per-minute limit
    (
        "anthropic-itpm",
        "This request would exceed your organization's rate limit of 30,000 input tokens per minute "
        "(org: x, model: claude-opus-4-6). Please reduce the prompt length or the maximum tokens "
        "requested, or try again later.",
    ),
    # A Bedrock throttle that says "too many tokens" (pi-mono's exclusion list)
    ("bedrock-throttle", "ThrottlingException: Too many tokens, please wait before trying again."),
    # The quota message OpenAI sends with 429 insufficient_quota
    (
        "openai-quota",
        "You exceeded your current quota, please check your plan and billing details.",
    ),
    # github.com/anthropics/claude-code/issues/11302: the OUTPUT cap, not the window
    (
        "anthropic-output-cap",
        '{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 21333 > '
        '4096, which is the maximum allowed number of output tokens for claude-3-opus-20240229"}}',
    ),
    # OpenAI's output cap (max_tokens larger than the model can write)
    (
        "openai-max-tokens-too-large",
        "max_tokens is too large: 128000. This model supports at most 16384 completion tokens, "
        "whereas you provided 128000.",
    ),
    # github.com/aws-samples/bedrock-access-gateway/issues/41: Bedrock's output cap
    (
        "bedrock-output-cap",
        "An error occurred (ValidationException) when calling the ConverseStream operation: The "
        "maximum tokens you requested exceeds the model limit of 2048. Try again with a maximum "
        "tokens value that is lower than 2048.",
    ),
    # One field over its own cap (OpenAI string_above_max_length), not the window
    (
        "openai-string-too-long",
        "Invalid 'messages[3].content': string too long. Expected a string with maximum length "
        "1048576, but got a string with length 2097152 instead.",
    ),
    # Generic 400s
    (
        "tool-pairing",
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
        "with 'tool_calls'.",
    ),
    # The bare phrases read as overflows must not catch output caps worded like them
    ("output-cap-exceeds", "max_tokens exceeds the model's maximum output tokens (8192)."),
    ("output-cap-number", "max_tokens is above the maximum number of tokens to generate (4096)."),
    ("bad-key", "Incorrect API key provided: sk-abc***def."),
    # TGI's output cap and its other validation errors (router/src/validation.rs)
    ("tgi-max-new-tokens", "Input validation error: `max_new_tokens` must be <= 2048. Given: 4096"),
    ("tgi-empty", "Input validation error: `inputs` cannot be empty"),
    # 413 as a number that is not a status
    ("number-413", "Processed 413 documents; 2 failed validation."),
    ("traceback-413", "File \"/app/worker.py\", line 413, in run\nKeyError: 'messages'"),
    ("server-error", "failed to load the model: the maximum context length is not available"),
    ("empty", ""),
]


class TestCorpus:
    """The real texts: every overflow is recognised with its numbers, no look-alike is."""

    @pytest.mark.parametrize(
        ("source", "text", "provider", "actual", "maximum"), OVERFLOWS, ids=[o[0] for o in OVERFLOWS]
    )
    def test_overflow_text_is_recognised_with_numbers(
        self, source: str, text: str, provider: str | None, actual: int | None, maximum: int | None
    ) -> None:
        """References 002 and 004: a provider's real overflow text yields its provider, input tokens and window."""
        assert detect_overflow(text) == OverflowInfo(provider, actual, maximum)

    @pytest.mark.parametrize(("source", "text"), NOT_OVERFLOWS, ids=[n[0] for n in NOT_OVERFLOWS])
    def test_look_alike_is_not_an_overflow(self, source: str, text: str) -> None:
        """Rate limits, quotas, output caps and generic 400s are not overflows, though some of reference 004's broader patterns (RESOURCE_EXHAUSTED, ValidationException.*token) would match them."""
        assert detect_overflow(text) is None


class TestParsing:
    """Numbers and providers in the less common shapes."""

    def test_thousands_separators_are_read(self) -> None:
        """Numbers written with thousands separators are parsed as integers."""
        info = detect_overflow("prompt is too long: 1,210,000 tokens > 1,000,000 maximum")
        assert info == OverflowInfo("anthropic", 1_210_000, 1_000_000)

    def test_case_does_not_matter(self) -> None:
        """The patterns ignore case ("Prompt is too long" vs "prompt is too long")."""
        info = detect_overflow("PROMPT IS TOO LONG: 300 TOKENS > 200 MAXIMUM")
        assert info == OverflowInfo("anthropic", 300, 200)

    def test_generic_phrase_counts_without_rate_limit_words(self) -> None:
        """A generic "context length exceeded" is an overflow when nothing says rate limit."""
        assert detect_overflow("upstream said: context length exceeded") == OverflowInfo(None, None, None)

    def test_generic_phrase_yields_to_rate_limit_words(self) -> None:
        """A generic "token limit exceeded" next to "rate limit" is a rate limit."""
        assert detect_overflow("Rate limit reached: token limit exceeded for this minute") is None

    def test_specific_overflow_wins_over_a_rate_limit_in_the_same_chain(self) -> None:
        """A proxy that hit a rate limit on a fallback still reports the original overflow."""
        text = (
            "prompt is too long: 210000 tokens > 200000 maximum\n"
            "Error doing the fallback: RateLimitError: rate limit exceeded"
        )
        assert detect_overflow(text) == OverflowInfo("anthropic", 210000, 200000)

    def test_very_long_text_is_handled_quickly(self) -> None:
        """A megabyte of noise around the error text neither hangs nor hides the overflow."""
        text = "prompt is too long: 9 tokens > 8 maximum " + "a" * 1_000_000
        assert detect_overflow(text) == OverflowInfo("anthropic", 9, 8)


class StatusError(Exception):
    """An SDK's HTTP error as the OpenAI, Anthropic and LiteLLM clients shape it.

    Detection reads these attributes by name; the SDKs' own constructors change between
    releases (OpenAI's 3.x takes another HTTP library's responses), so the real exceptions
    are tested through the installed LiteLLM in :class:`TestThroughLiteLLM`.
    """

    def __init__(self, message: str, *, response: httpx.Response, body: object) -> None:
        super().__init__(message)
        self.response = response
        self.status_code = response.status_code
        self.body = body


class TestExceptions:
    """Exceptions: LiteLLM's type, chains, and the provider attribute."""

    def test_litellm_context_window_error_is_recognised(self) -> None:
        """LiteLLM's ContextWindowExceededError with an OpenAI message yields its numbers."""
        error = litellm.exceptions.ContextWindowExceededError(
            message="This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens.",
            model="gpt-4",
            llm_provider="openai",
        )
        assert detect_overflow(error) == OverflowInfo("openai", 9000, 8192)

    def test_typed_error_without_known_text_is_still_an_overflow(self) -> None:
        """The type alone is enough; the provider comes from its llm_provider attribute."""
        error = litellm.exceptions.ContextWindowExceededError(
            message="refused", model="m", llm_provider="cohere"
        )
        assert detect_overflow(error) == OverflowInfo("cohere", None, None)

    def test_overflow_found_through_the_cause_chain(self) -> None:
        """Reference 004 (error.cause): an overflow wrapped by another exception (raise ... from e) is found via __cause__."""
        outer = RuntimeError("summarizing failed")
        outer.__cause__ = ValueError("prompt is too long: 210000 tokens > 200000 maximum")
        assert detect_overflow(outer) == OverflowInfo("anthropic", 210000, 200000)

    def test_overflow_found_through_the_context_chain(self) -> None:
        """An overflow being handled when another error was raised is found via __context__."""
        outer = KeyError("handler broke")
        outer.__context__ = ValueError(
            "The input token count (5) exceeds the maximum number of tokens allowed (4)."
        )
        assert detect_overflow(outer) == OverflowInfo("gemini", 5, 4)

    def test_provider_attribute_names_a_shared_wording(self) -> None:
        """OpenAI-style text from an Azure deployment is attributed to azure by llm_provider."""
        error = litellm.exceptions.BadRequestError(
            message="This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9001 tokens.",
            model="my-deployment",
            llm_provider="azure",
        )
        assert detect_overflow(error) == OverflowInfo("azure", 9001, 8192)

    def test_plain_bad_request_is_not_an_overflow(self) -> None:
        """A LiteLLM BadRequestError about something else is not an overflow."""
        error = litellm.exceptions.BadRequestError(
            message="invalid tool schema", model="m", llm_provider="openai"
        )
        assert detect_overflow(error) is None

    def test_rate_limit_error_is_not_an_overflow(self) -> None:
        """LiteLLM's RateLimitError with a TPM message is not an overflow."""
        error = litellm.exceptions.RateLimitError(
            message="Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000",
            llm_provider="openai",
            model="gpt-4o",
        )
        assert detect_overflow(error) is None

    def test_status_413_on_the_exception_is_an_overflow(self) -> None:
        """An SDK's 413 with no telling text is an overflow: the body was too large."""
        request = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
        error = StatusError("request failed", response=httpx.Response(413, request=request), body=None)
        assert detect_overflow(error) == OverflowInfo(None, None, None)

    def test_status_413_on_a_wrapped_response_is_an_overflow(self) -> None:
        """httpx's HTTPStatusError keeps the status on its response, found through the cause chain."""
        request = httpx.Request("POST", "https://gateway.internal/v1/messages")
        cause = httpx.HTTPStatusError("upstream failed", request=request, response=httpx.Response(413))
        outer = RuntimeError("call failed")
        outer.__cause__ = cause
        assert detect_overflow(outer) == OverflowInfo(None, None, None)

    def test_other_statuses_are_not_overflows(self) -> None:
        """A 400 or 429 without overflow text stays what it is."""
        request = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
        for status in (400, 429):
            error = StatusError("request failed", response=httpx.Response(status, request=request), body=None)
            assert detect_overflow(error) is None

    def test_azure_deployment_through_an_sdk(self) -> None:
        """OpenAI's wording from an Azure endpoint is Azure's (the request URL says so)."""
        body = {
            "message": "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130211 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
        request = httpx.Request(
            "POST",
            "https://contoso.openai.azure.com/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
        )
        error = StatusError(
            f"Error code: 400 - {{'error': {body}}}",
            response=httpx.Response(400, request=request),
            body={"error": body},
        )
        assert detect_overflow(error) == OverflowInfo("azure", 130211, 128000)

    def test_anthropic_wording_from_a_bedrock_endpoint(self) -> None:
        """Anthropic's sentence from an exception whose request went to bedrock-runtime is Bedrock's."""

        class APIError(Exception):
            def __init__(self, message: str, request: httpx.Request) -> None:
                super().__init__(message)
                self.request = request

        request = httpx.Request(
            "POST",
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/"
            "anthropic.claude-3-5-sonnet-20241022-v2:0/invoke",
        )
        error = APIError(
            "Error code: 400 - {'message': 'prompt is too long: 201330 tokens > 200000 maximum'}", request
        )
        assert detect_overflow(error) == OverflowInfo("bedrock", 201330, 200000)

    def test_a_response_without_a_request_is_read_safely(self) -> None:
        """httpx raises for a hand-built response's missing request; detection goes on without it."""

        class GatewayError(Exception):
            def __init__(self, response: httpx.Response) -> None:
                super().__init__("gateway refused the call")
                self.response = response

        response = httpx.Response(413)
        with pytest.raises(RuntimeError):
            _ = response.request
        assert detect_overflow(GatewayError(response)) == OverflowInfo(None, None, None)

    def test_self_referencing_chain_terminates(self) -> None:
        """A cycle in __cause__/__context__ does not loop forever."""
        error = ValueError("nothing relevant")
        error.__context__ = error
        assert detect_overflow(error) is None


class TestErrorBodies:
    """Provider error bodies passed as parsed JSON: nested dicts and lists, as SDKs and runtimes hold them."""

    def test_openai_body(self) -> None:
        """OpenAI's {"error": {"message", "code"}} yields its numbers."""
        body = {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
        assert detect_overflow(body) == OverflowInfo("openai", 9000, 8192)

    def test_gemini_list_body(self) -> None:
        """Gemini's REST error is a list of {"error": {...}}."""
        body = [
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1200293) exceeds the maximum number of tokens "
                    "allowed (1048576).",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ]
        assert detect_overflow(body) == OverflowInfo("gemini", 1200293, 1048576)

    def test_anthropic_body_with_a_nested_message(self) -> None:
        """Anthropic's {"type": "error", "error": {"type", "message"}}."""
        body = {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208656 tokens > 200000 maximum",
            },
        }
        assert detect_overflow(body) == OverflowInfo("anthropic", 208656, 200000)

    @pytest.mark.parametrize(
        "body",
        [
            {"status": 413},
            {"error": {"code": 413, "message": "Payload rejected"}},
            {"errorType": "Error", "$metadata": {"httpStatusCode": 413}},
            [{"error": {"code": "413"}}],
        ],
    )
    def test_a_413_status_in_the_body(self, body: Any) -> None:
        """A 413 under a status or code key, at any depth, is an overflow without numbers."""
        assert detect_overflow(body) == OverflowInfo(None, None, None)

    @pytest.mark.parametrize(
        "body",
        [
            {"error": {"code": 400, "message": "invalid tool schema"}},
            {
                "error": {
                    "message": "Rate limit reached on tokens per min (TPM)",
                    "code": "rate_limit_exceeded",
                }
            },
            {},
            [],
            {
                "error": {
                    "code": 429,
                    "message": "Resource has been exhausted",
                    "status": "RESOURCE_EXHAUSTED",
                }
            },
        ],
    )
    def test_other_bodies_are_not_overflows(self, body: Any) -> None:
        """Bodies about something else, and empty ones, are not overflows."""
        assert detect_overflow(body) is None

    def test_a_circular_body_does_not_break_detection(self) -> None:
        """A body that refers to itself is read, not serialised forever."""
        body: dict[str, Any] = {"message": "prompt is too long: 9 tokens > 8 maximum"}
        body["self"] = body
        assert detect_overflow(body) == OverflowInfo("anthropic", 9, 8)


# Reference 004's per-provider phrases that are recognised on their own: (provider named in
# the reference, text, provider reported, window read from the text).
REFERENCE_004_PHRASES: list[tuple[str, str, str | None, int | None]] = [
    ("openai", "This model's maximum context length is 8192 tokens.", "openai", 8192),
    ("azure", "Error code: 400 - content_length_exceeded", "azure", None),
    ("google", "The input token count exceeds the maximum number of tokens allowed.", "gemini", None),
    ("bedrock-input", "ValidationException: Input is too long for requested model.", "bedrock", None),
    ("bedrock-maximum", "The prompt exceeds the model's maximum context length of 8192 tokens.", None, 8192),
    ("mistral", "context length exceeded", None, None),
    ("openrouter", "context_length_exceeded", None, None),
    ("anthropic-prompt", "prompt is too long", "anthropic", None),
    ("anthropic-tokens", "Too many tokens in the request", None, None),
    ("anthropic-413", "Error 413: prompt_too_long", "anthropic", None),
    ("openai-reduce", "Please reduce the length of the messages.", "openai", None),
    ("anthropic-input", "input is too long", None, None),
    ("google-content", "The content is too long for this model.", None, None),
    ("bedrock-exceeds", "The request exceeds the model's maximum.", None, None),
    ("mistral-maximum", "Prompt contains more than the maximum number of tokens.", None, None),
]


class TestReferencePatterns:
    """Reference 004 (error detection): the overflow phrases it lists per provider."""

    @pytest.mark.parametrize(
        ("source", "text", "provider", "maximum"),
        REFERENCE_004_PHRASES,
        ids=[p[0] for p in REFERENCE_004_PHRASES],
    )
    def test_listed_phrase_is_an_overflow(
        self, source: str, text: str, provider: str | None, maximum: int | None
    ) -> None:
        """Reference 004: each provider's listed phrase alone is an overflow, attributed where the phrase is the provider's own."""
        assert detect_overflow(text) == OverflowInfo(provider, None, maximum)

    def test_resource_exhausted_is_a_quota_not_an_overflow(self) -> None:
        """Reference 004 lists Google's RESOURCE_EXHAUSTED; it is Gemini's 429 quota status, which compaction cannot fix."""
        text = (
            '{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", '
            '"status": "RESOURCE_EXHAUSTED"}}'
        )
        assert detect_overflow(text) is None


PROXY_413 = (
    "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    "<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)


async def _litellm_error(fake_llm: FakeLLMServer) -> BaseException:
    """The exception the installed LiteLLM raises for the fake provider's next queued failure."""
    with pytest.raises(Exception) as caught:  # noqa: PT011  # whichever class LiteLLM maps it to
        await litellm.acompletion(
            model="openai/fake",
            messages=[{"role": "user", "content": "hi"}],
            api_base=fake_llm.url,
            api_key="fake",
            max_retries=0,
        )
    return caught.value


class TestThroughLiteLLM:
    """Real exceptions from the installed LiteLLM, built from what a provider or proxy sends.

    Only this project's verdict is asserted (overflow or not, provider, numbers), never the
    class LiteLLM maps a body to or how it words its message: those change between releases.
    """

    @pytest.mark.parametrize("provider", sorted(OVERFLOW_PROVIDERS))
    async def test_a_providers_json_overflow_body(self, fake_llm: FakeLLMServer, provider: str) -> None:
        """Each provider's real body behind an OpenAI-compatible endpoint: an overflow, with its numbers."""
        fake_llm.overflow_next(1, provider=provider, actual=9000, maximum=8192)
        assert detect_overflow(await _litellm_error(fake_llm)) == OverflowInfo("openai", 9000, 8192)

    @pytest.mark.parametrize(
        "text",
        [
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
            "prompt is too long: 9000 tokens > 8192 maximum",
            "The input token count (9000) exceeds the maximum number of tokens allowed (8192).",
        ],
    )
    async def test_a_plain_text_overflow_body(self, fake_llm: FakeLLMServer, text: str) -> None:
        """A proxy that answers in text: read from the response, whatever the exception message says."""
        fake_llm.fail_next(1, 400, text)
        assert detect_overflow(await _litellm_error(fake_llm)) == OverflowInfo("openai", 9000, 8192)

    async def test_a_proxys_html_413(self, fake_llm: FakeLLMServer) -> None:
        """nginx's 413 page in front of the provider: an overflow without numbers."""
        fake_llm.fail_next(1, 413, PROXY_413)
        info = detect_overflow(await _litellm_error(fake_llm))
        assert info is not None
        assert (info.actual_tokens, info.max_tokens) == (None, None)

    @pytest.mark.parametrize(
        ("status", "body"),
        [
            (400, "upstream said no"),
            (400, {"error": {"message": "invalid tool schema", "type": "invalid_request_error"}}),
            (
                429,
                {
                    "error": {
                        "message": "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000,"
                        " Requested 31538.",
                        "type": "tokens",
                        "code": "rate_limit_exceeded",
                    }
                },
            ),
            (500, "<html><body><h1>502 Bad Gateway</h1></body></html>"),
        ],
    )
    async def test_other_failures_are_not_overflows(
        self, fake_llm: FakeLLMServer, status: int, body: dict[str, Any] | str
    ) -> None:
        """A plain refusal, a rate limit or a gateway error stays what it is."""
        fake_llm.fail_next(1, status, body)
        assert detect_overflow(await _litellm_error(fake_llm)) is None
