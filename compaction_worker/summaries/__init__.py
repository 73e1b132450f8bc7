"""The summarizers: one contract, the LiteLLM and extractive implementations, prompts, artifacts."""
