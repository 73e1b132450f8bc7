"""The overflow corpus: context-overflow error texts providers really send, each with its source.

Numbers in the texts are the ones the reporters saw.
"""

from __future__ import annotations

# (source, text, provider, actual input tokens, window)
OVERFLOWS: list[tuple[str, str, str | None, int | None, int | None]] = [
    # --- OpenAI ---------------------------------------------------------------------------
    (
        # github.com/chathub-dev/chathub/issues/126 (chat completions, with the error code)
        "openai-messages",
        '{"error":{"message":"This model\'s maximum context length is 4097 tokens. However, your '
        'messages resulted in 4294 tokens. Please reduce the length of the messages.","type":'
        '"invalid_request_error","param":"messages","code":"context_length_exceeded"}}',
        "openai",
        4294,
        4097,
    ),
    (
        # github.com/bytedance/deer-flow/issues/310 (functions count as input too)
        "openai-functions",
        "BadRequestError('Error code: 400 - {\\'error\\': {\\'message\\': \"This model\\'s maximum "
        "context length is 128000 tokens. However, your messages resulted in 202868 tokens "
        "(202767 in the messages, 101 in the functions). Please reduce the length of the messages "
        "or functions.\", \\'type\\': \\'invalid_request_error\\', \\'param\\': \\'messages\\', "
        "\\'code\\': \\'context_length_exceeded\\'}}')",
        "openai",
        202868,
        128000,
    ),
    (
        # github.com/FoundationAgents/OpenManus/issues/62 (messages, functions and completion)
        "openai-requested-with-completion",
        "Error code: 400 - {'error': {'message': \"This model's maximum context length is 8192 "
        "tokens. However, you requested 8213 tokens (6683 in the messages, 730 in the functions, "
        "and 800 in the completion). Please reduce the length of the messages, functions, or "
        "completion.\", 'type': 'invalid_request_error', 'param': 'messages', 'code': "
        "'context_length_exceeded'}}",
        "openai",
        7413,
        8192,
    ),
    (
        # github.com/tatsu-lab/stanford_alpaca/issues/47 (legacy completions wording)
        "openai-legacy-completions",
        "OpenAIError: This model's maximum context length is 4097 tokens, however you requested "
        "4162 tokens (1090 in your prompt; 3072 for the completion). Please reduce your prompt; "
        "or completion length..",
        "openai",
        1090,
        4097,
    ),
    (
        # github.com/BerriAI/litellm/issues/18927 (gpt-5.1 through LiteLLM)
        "openai-configured-limit",
        "ContextWindowExceededError: OpenAIException - Input tokens exceed the configured limit "
        "of 272000 tokens.",
        "openai",
        None,
        272000,
    ),
    # --- Azure OpenAI -----------------------------------------------------------------------
    (
        # github.com/Azure/azure-sdk-for-python/issues/40986 (azure-ai-inference)
        "azure-inference-sdk",
        "(context_length_exceeded) This model's maximum context length is 128000 tokens. However, "
        "you requested 1124171 tokens (124171 in the messages, 1000000 in the completion). Please "
        "reduce the length of the messages or completion.\nCode: context_length_exceeded",
        "azure",
        124171,
        128000,
    ),
    (
        # github.com/microsoft/kernel-memory/issues/516 (Azure.RequestFailedException)
        "azure-dotnet",
        "Azure.RequestFailedException: This model's maximum context length is 8192 tokens. However, "
        "your messages resulted in 10383 tokens. Please reduce the length of the messages. Status: "
        "400 (model_error) ErrorCode: context_length_exceeded",
        "azure",
        10383,
        8192,
    ),
    (
        # github.com/elastic/kibana/pull/176353 (Kibana's Azure OpenAI connector)
        "azure-kibana-connector",
        "ActionsClientLlm: action result status is error: an error occurred while running the "
        "action - Status code: 400. Message: API Error: model_error - This model's maximum context "
        "length is 8192 tokens. However, your messages resulted in 16900 tokens. Please reduce the "
        "length of the messages.",
        "azure",
        16900,
        8192,
    ),
    # --- Anthropic --------------------------------------------------------------------------
    (
        # github.com/sojohnnysaid/project-guide/issues/2 (anthropic SDK)
        "anthropic",
        "anthropic.BadRequestError: Error code: 400 - {'type': 'error', 'error': {'type': "
        "'invalid_request_error', 'message': 'prompt is too long: 208656 tokens > 200000 maximum'}}",
        "anthropic",
        208656,
        200000,
    ),
    (
        # github.com/entropy-research/Devon/issues/88 (through LiteLLM, typed by it)
        "anthropic-via-litellm",
        'litellm.BadRequestError: litellm.ContextWindowExceededError: AnthropicError - {"type":'
        '"error","error":{"type":"invalid_request_error","message":"prompt is too long: 209353 '
        'tokens > 199999 maximum"}}',
        "anthropic",
        209353,
        199999,
    ),
    (
        # github.com/BrokkAi/brokk-app/issues/540 (LiteLLM proxy did NOT type this one)
        "anthropic-input-plus-max-tokens",
        '{"error":{"message":"litellm.BadRequestError: AnthropicException - b\'{\\"type\\":\\"error'
        '\\",\\"error\\":{\\"type\\":\\"invalid_request_error\\",\\"message\\":\\"input length and '
        "`max_tokens` exceed context limit: 179413 + 32768 > 200000, decrease input length or "
        "`max_tokens` and try again\\\"}}'. Received Model Group=anthropic/claude-sonnet-4-20250514"
        '\\nAvailable Model Group Fallbacks=None","type":null,"param":null,"code":"400"}}',
        "anthropic",
        179413,
        200000,
    ),
    # --- Gemini / Vertex AI -----------------------------------------------------------------
    (
        # github.com/google-gemini/gemini-cli/issues/6678
        "gemini",
        '[{"error": {"code": 400, "message": "The input token count (1200293) exceeds the maximum '
        'number of tokens allowed (1048576).", "errors": [{"message": "The input token count '
        '(1200293) exceeds the maximum number of tokens allowed (1048576).", "domain": "global", '
        '"reason": "badRequest"}], "status": "INVALID_ARGUMENT"}}]',
        "gemini",
        1200293,
        1048576,
    ),
    (
        # github.com/google-gemini/gemini-cli/issues/4118
        "gemini-got-status",
        'got status: INVALID_ARGUMENT. {"error":{"code":400,"message":"The input token count '
        '(132478) exceeds the maximum number of tokens allowed (131072).","status":'
        '"INVALID_ARGUMENT"}}',
        "gemini",
        132478,
        131072,
    ),
    # --- Bedrock ----------------------------------------------------------------------------
    (
        # github.com/aws-samples/assessment-generator/issues/2 (ValidationException)
        "bedrock",
        "ValidationException: Input is too long for requested model.",
        "bedrock",
        None,
        None,
    ),
    (
        # github.com/continuedev/continue/issues/6005 (ConverseStream)
        "bedrock-stream",
        "Error processing Bedrock stream: The model returned the following errors: Input is too "
        "long for requested model.",
        "bedrock",
        None,
        None,
    ),
    (
        # quoted in github.com/pkdone/paul-genai-test-tools-ts (Bedrock Titan/Mistral manifests)
        "bedrock-too-many-input-tokens",
        "ValidationException: 400 Bad Request: Too many input tokens. Max input tokens: 8192, "
        "request input token count: 9279 ",
        "bedrock",
        9279,
        8192,
    ),
    (
        # github.com/ryanadoty/Amazon-Bedrock-Amazon-RDS-POC/issues/9 (a limit in characters)
        "bedrock-max-length-chars",
        "botocore.errorfactory.ValidationException: An error occurred (ValidationException) when "
        "calling the InvokeModel operation: Malformed input request: expected maxLength: 42000, "
        "actual: 46735, please reformat your input and try again.",
        "bedrock",
        None,
        None,
    ),
    (
        # github.com/daisuke-awaji/moca/issues/254 (Anthropic's wording relayed by Bedrock)
        "bedrock-relaying-anthropic",
        "[SYSTEM_ERROR] An error occurred.\nType: ValidationException\nDetails: The model returned "
        "the following errors: prompt is too long: 200049 tokens > 200000 maximum\nRequest ID: "
        "9251f066-a420-483b-b3ae-7485084f6dc6\n[/SYSTEM_ERROR]",
        "bedrock",
        200049,
        200000,
    ),
    (
        # github.com/gsd-build/gsd-2/issues/5411 (OpenAI's wording relayed by Bedrock Mantle)
        "bedrock-relaying-openai",
        "The model returned the following errors: Mantle streaming error for requestId 1f2e:\n"
        'ErrorEvent { error: APIError { type: "BadRequestError", code: Some(400),\nmessage: "This '
        "model's maximum context length is 32768 tokens. However, you\nrequested 8192 output tokens "
        'and your prompt contains 64764 input tokens,\nfor a total of 72956 tokens." } }',
        "bedrock",
        64764,
        32768,
    ),
    (
        # Anthropic's wording in a botocore ClientError (InvokeModel with an Anthropic body)
        "bedrock-botocore-anthropic",
        "botocore.errorfactory.ValidationException: An error occurred (ValidationException) when "
        "calling the InvokeModel operation: prompt is too long: 215343 tokens > 200000 maximum",
        "bedrock",
        215343,
        200000,
    ),
    (
        # Claude 4.5 / Bedrock Converse stop reason (UKGovernmentBEIS/inspect_ai issue #2941)
        "bedrock-stop-reason",
        "stopReason: model_context_window_exceeded",
        None,
        None,
        None,
    ),
    # --- Mistral ----------------------------------------------------------------------------
    (
        # mistralai Python SDK error body, as quoted in public code; docs.mistral.ai known-limitations
        "mistral",
        'mistralai.client.errors.sdkerror.SDKError: API error occurred: Status 400. Body: {"object":'
        '"error","message":"Prompt contains 159202 tokens and 0 draft tokens, too large for model '
        'with 131072 maximum context length","type":"invalid_request_invalid_args","param":null,'
        '"code":"3051","raw_status_code":400}',
        "mistral",
        159202,
        131072,
    ),
    (
        # portkey.ai error library, mistral-ai context_length_exceeded_error (older wording)
        "mistral-older",
        "Prompt contains 66385 tokens, too large for model with 32768 maximum context length",
        "mistral",
        66385,
        32768,
    ),
    # --- vLLM / SGLang / Ollama / local servers ---------------------------------------------
    (
        # github.com/vllm-project/vllm/issues/20409
        "vllm-requested",
        "Error code: 400 - {'object': 'error', 'message': \"This model's maximum context length is "
        "16384 tokens. However, you requested 19591 tokens (9591 in the messages, 10000 in the "
        "completion). Please reduce the length of the messages or completion. None\", 'type': "
        "'BadRequestError', 'param': None, 'code': 400}",
        "openai",
        9591,
        16384,
    ),
    (
        # github.com/Nikita-Filonov/ai-review/issues/27 (newer vLLM, through LiteLLM)
        "vllm-request-has",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: "
        "OpenAIException - This model's maximum context length is 262144 tokens. However, your "
        "request has 279750 input tokens. Please reduce the length of the input messages",
        "openai",
        279750,
        262144,
    ),
    (
        # github.com/BerriAI/litellm/issues/12680 (LiteLLM proxy in front of vLLM)
        "vllm-via-litellm-proxy",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: "
        "Hosted_vllmException - Error code: 400 - {'object': 'error', 'message': \"This model's "
        "maximum context length is 32768 tokens. However, you requested 33077 tokens (1077 in the "
        "messages, 32000 in the completion). Please reduce the length of the messages or "
        "completion. None\", 'type': 'BadRequestError', 'param': None, 'code': 400}",
        "vllm",
        1077,
        32768,
    ),
    (
        # github.com/vllm-project/vllm/issues/12165 (engine-level ValueError)
        "vllm-engine",
        "ValueError: The prompt (total length 25938) is too long to fit into the model (context "
        "length 4096). Make sure that `max_model_len` is no smaller than the number of text tokens "
        "plus multimodal tokens.",
        "vllm",
        25938,
        4096,
    ),
    (
        # github.com/huggingface/chat-ui/issues/340 (TGI's router, Hugging Face Inference API)
        "tgi-total-tokens",
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. Given: 1000 "
        "`inputs` tokens and 1024 `max_new_tokens`",
        "huggingface",
        1000,
        1512,
    ),
    (
        # TGI router/src/validation.rs MaxTotalTokens, through huggingface_hub's client
        "tgi-total-tokens-hub",
        "huggingface_hub.errors.ValidationError: Input validation error: `inputs` tokens + "
        "`max_new_tokens` must be <= 32768. Given: 31744 `inputs` tokens and 2048 `max_new_tokens`",
        "huggingface",
        31744,
        32768,
    ),
    (
        # TGI before 0.9 (router/src/validation.rs, no backticks, "input")
        "tgi-total-tokens-old",
        "Input validation error: input tokens + max_new_tokens must be <= 2048. Given: 1950 input "
        "tokens and 200 max_new_tokens",
        "huggingface",
        1950,
        2048,
    ),
    (
        # TGI router/src/validation.rs InputLength (--max-input-tokens)
        "tgi-input-length",
        '{"error":"Input validation error: `inputs` must have less than 4096 tokens. Given: 4522",'
        '"error_type":"validation"}',
        "huggingface",
        4522,
        4096,
    ),
    (
        # github.com/BerriAI/litellm/issues/10793 (SGLang's wording)
        "sglang",
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        None,
        5000,
        4096,
    ),
    (
        # Ollama 400 body, as quoted in public tests of an Ollama client
        "ollama-prompt-too-long",
        'Ollama API error 400: {"StatusCode":400,"Status":"400 Bad Request","error":"prompt too '
        'long; exceeded max context length by 4 tokens"}',
        "ollama",
        None,
        None,
    ),
    (
        # Ollama's /api/embed 400 body, quoted in many public issue logs (Ollama 0.21)
        "ollama-input-length",
        '400 {"error":"the input length exceeds the context length"}',
        "ollama",
        None,
        None,
    ),
    (
        # github.com/lmstudio-ai/model-catalog/issues/38 (LM Studio)
        "lm-studio",
        "An error occurred\n\nInput length 1581 exceeds context length 1500",
        None,
        1581,
        1500,
    ),
    (
        # github.com/anomalyco/opencode/issues/1551 (Cerebras, Qwen 3 Coder)
        "cerebras",
        "AI_APICallError: Please reduce the length of the messages or completion. Current length is "
        "69553 while limit is 65536",
        None,
        69553,
        65536,
    ),
    (
        # github.com/topoteretes/cognee/issues/1061 (OpenRouter through LiteLLM)
        "openrouter",
        'litellm.BadRequestError: OpenrouterException - {"error":{"message":"This endpoint\'s '
        "maximum context length is 16384 tokens. However, you requested about 94307 tokens (94307 "
        'of text input). Please reduce the length of either one, or use the \\"middle-out\\" '
        'transform to compress your prompt automatically.","code":400,"metadata":{"provider_name":'
        "null}}}",
        "openrouter",
        94307,
        16384,
    ),
    # --- HTTP 413: the request body is too large ------------------------------------------
    (
        # github.com/anthropics/anthropic-sdk-python/issues/938
        "anthropic-413",
        "anthropic._exceptions.RequestTooLargeError: Error code: 413 - {'error': {'type': "
        "'request_too_large', 'message': 'Request exceeds the maximum size'}}",
        "anthropic",
        None,
        None,
    ),
    (
        # github.com/anthropics/claude-code/issues/3335
        "anthropic-413-api-error",
        'API Error: 413 {"error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}',
        "anthropic",
        None,
        None,
    ),
    (
        # github.com/vm0-ai/vm0/issues/34178 (openresty in front of api.deepseek.com)
        "openresty-413",
        "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center>"
        "<h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>openresty</center>\r\n"
        "</body>\r\n</html>",
        None,
        None,
        None,
    ),
    ("bare-413", "HTTP 413", None, None, None),
    ("status-413", "upstream request failed with status 413", None, None, None),
    ("payload-too-large", "413 Payload Too Large", None, None, None),
    # --- LiteLLM proxy wrappers -------------------------------------------------------------
    (
        # github.com/OpenHands/OpenHands/issues/5350 (proxy: Bedrock error, then Anthropic fallback)
        "litellm-proxy-fallback-chain",
        "litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'message': "
        '\'litellm.BadRequestError: BedrockException - {"message":"messages.32.content: '
        'Conversation blocks and tool result blocks cannot be provided in the same turn."}\\n. '
        "Received Model Group=claude-3-5-sonnet-20241022\\nAvailable Model Group Fallbacks="
        "['anthropic/claude-3-5-sonnet-20241022']\\nError doing the fallback: litellm.BadRequestError:"
        ' litellm.ContextWindowExceededError: AnthropicError - {"type":"error","error":{"type":'
        '"invalid_request_error","message":"prompt is too long: 209303 tokens > 200000 maximum"}}'
        "', 'type': None, 'param': None, 'code': '400'}}",
        "anthropic",
        209303,
        200000,
    ),
]
