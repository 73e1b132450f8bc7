"""Tests for the context-window registry (compaction_worker.budget.windows)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import uuid
from typing import Any

import pytest

from compaction_worker import _litellm
from compaction_worker._litellm import litellm
from compaction_worker.budget import windows
from compaction_worker.budget.windows import (
    DEFAULT_FALLBACK_WINDOW,
    WindowInfo,
    base_name,
    known_window,
    resolve_window,
)
from compaction_worker.settings import BudgetSettings

LOGGER = "compaction_worker.budget.windows"


def unknown_model() -> str:
    """A model string no registry knows, fresh per call (lookups are cached per model)."""
    return f"acme/unknown-{uuid.uuid4().hex}"


def bundled(model: str, field: str) -> Any:
    return litellm.model_cost[model][field]


def _raw_map() -> dict[str, Any]:
    path = _litellm._package_dir() / _litellm.MODEL_MAP_FILE
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return raw


def litellm_window(model: str) -> int | None:
    """What LiteLLM's own lookup says, None when it cannot map the name."""
    try:
        window: int | None = litellm.get_model_info(model).get("max_input_tokens")
    except Exception:
        return None
    return window


class TestRegistry:
    def test_known_model(self) -> None:
        """References 003 and 004 (a context-window registry): gpt-4o's window and output limit come from LiteLLM's bundled map."""
        expected = WindowInfo("gpt-4o", 128_000, bundled("gpt-4o", "max_output_tokens"), "registry")

        assert expected == resolve_window("gpt-4o", BudgetSettings())

    @pytest.mark.parametrize(
        ("model", "window"),
        [
            ("openai/gpt-4o", 128_000),
            ("azure/gpt-4o", 128_000),
            ("openrouter/openai/gpt-4o", 128_000),
            ("gpt-4", 8_192),
            ("anthropic/claude-sonnet-4-20250514", 200_000),
            ("bedrock/anthropic.claude-3-5-sonnet-20241022-v2:0", 200_000),
            ("gemini/gemini-2.5-pro", 1_048_576),
            ("vertex_ai/gemini-2.5-pro", 1_048_576),
            ("ollama/llama3", 8_192),
            ("GPT-4o", 128_000),
        ],
    )
    def test_provider_prefixed(self, model: str, window: int) -> None:
        """Reference 004 (provider and prefix matching): provider and router prefixes resolve to the model's registry window."""
        info = resolve_window(model, BudgetSettings())

        assert (window, "registry") == (info.window, info.source)

    @pytest.mark.parametrize(
        ("model", "window"),
        [
            # Anthropic's dated 3.x ids survive only as Bedrock / Vertex ids in the map.
            ("claude-3-5-sonnet-20241022", 200_000),
            ("claude-3-opus-20240229", 200_000),
            ("claude-3-5-sonnet-latest", 200_000),
            # The map only has it as "mistral/mistral-large-latest".
            ("mistral-large-latest", bundled("mistral/mistral-large-latest", "max_input_tokens")),
            # OpenAI's own entry has every limit set to None; Azure's does not.
            ("o1-mini", bundled("azure/o1-mini", "max_input_tokens")),
        ],
    )
    def test_aliases_litellm_misses(self, model: str, window: int) -> None:
        """Names LiteLLM's own lookup cannot map still resolve through known aliases."""
        info = resolve_window(model, BudgetSettings())

        assert litellm_window(model) is None
        assert (window, "registry") == (info.window, info.source)

    def test_output_limit_from_registry(self) -> None:
        """max_output_tokens is the registry's, not the window."""
        expected = (8_192, 4_096)

        info = resolve_window("gpt-4", BudgetSettings())

        assert expected == (info.window, info.max_output_tokens)

    @pytest.mark.parametrize("model", ["gpt-4o", "openai/gpt-4o", "claude-3-5-sonnet-20241022"])
    def test_is_known_model(self, model: str) -> None:
        """Models the registry maps, directly or by alias, are known."""
        assert known_window(model) is not None

    @pytest.mark.parametrize("model", ["", " ", "/", "nope", "acme/unknown-model", "\x00" * 3])
    def test_is_not_known_model(self, model: str) -> None:
        """Anything the registry cannot map is unknown, without raising."""
        assert known_window(model) is None

    def test_lookups_are_cached(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A second resolution of the same model does not read the map again."""
        calls: list[str] = []
        real = windows._lookup

        def counting(name: str) -> Any:
            calls.append(name)
            return real(name)

        monkeypatch.setattr(windows, "_lookup", counting)
        windows._registry_cached.cache_clear()

        resolve_window("claude-3-5-sonnet-20241022", BudgetSettings())
        first = len(calls)
        resolve_window("claude-3-5-sonnet-20241022", BudgetSettings())

        assert first > 0
        assert first == len(calls)

    def test_every_entry_litellm_maps_has_litellms_window(self) -> None:
        """Issue 32: the registry reads LiteLLM's bundled map itself; for every chat entry LiteLLM's
        own lookup maps, the window is LiteLLM's."""
        differ = []
        for key, entry in _litellm.model_map().items():
            if entry.get("mode") != "chat":
                continue
            expected = litellm_window(key)  # 0 in a few entries: no window stated
            if expected and resolve_window(key, BudgetSettings()).window != expected:
                differ.append(key)

        assert differ == []

    def test_alias_entries_resolve_to_the_model_they_name(self) -> None:
        """The map's "-latest" aliases ({"alias_of": ...}) have the window of the entry they name."""
        aliases = {k: v["alias_of"] for k, v in _raw_map().items() if "alias_of" in v}
        assert aliases
        for alias, target in aliases.items():
            assert windows._lookup(alias) == windows._lookup(target), alias

    def test_resolving_a_window_does_not_import_litellm(self) -> None:
        """Issue 32: a window lookup costs milliseconds, not LiteLLM's import (seconds a process)."""
        code = (
            "import sys\n"
            "from compaction_worker.budget.windows import resolve_window\n"
            "from compaction_worker.settings import BudgetSettings\n"
            "for m in ('gpt-4o', 'openrouter/anthropic/claude-3.5-sonnet', 'bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0'):\n"
            "    assert resolve_window(m, BudgetSettings()).source == 'registry', m\n"
            "print('litellm' in sys.modules)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        )

        assert done.stdout.strip() == "False"

    def test_lookups_never_touch_the_network(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Providers LiteLLM would query live (Ollama, Hugging Face) are looked up offline."""
        connects: list[object] = []

        def record(self: socket.socket, address: object) -> None:
            connects.append(address)
            raise OSError("network disabled in this test")

        monkeypatch.setattr(socket.socket, "connect", record)
        windows._registry_cached.cache_clear()
        models = [
            "ollama/llama3",
            "ollama/llama3.1:8b",
            "ollama_chat/qwen2",
            "huggingface/meta-llama/Llama-3-8B",
            "huggingface/acme/unknown-model",
            "lemonade/some-model",
            "hosted_vllm/some-model",
            "gpt-4o",
            "gemini/gemini-2.5-pro",
            "claude-3-5-sonnet-20241022",
        ]

        # llama3.1:8b is Ollama's tag of llama3.1; Llama-3-8B is in the map under other hosts.
        expected = ["registry"] * 2 + ["fallback", "registry"] + ["fallback"] * 3 + ["registry"] * 3

        sources = [resolve_window(m, BudgetSettings()).source for m in models]

        assert not connects
        assert expected == sources


class TestPriority:
    def test_override_beats_registry(self) -> None:
        """Reference 003 (windows configurable per model): a configured override replaces the registry's window but keeps its output limit."""
        settings = BudgetSettings(window_overrides={"gpt-4o": 50_000})
        expected = WindowInfo("gpt-4o", 50_000, bundled("gpt-4o", "max_output_tokens"), "override")

        assert expected == resolve_window("gpt-4o", settings)

    def test_override_matches_without_provider_prefix(self) -> None:
        """An override keyed by the bare name applies to the provider-prefixed model."""
        settings = BudgetSettings(window_overrides={"gpt-4o": 50_000})
        expected = WindowInfo("openai/gpt-4o", 50_000, bundled("gpt-4o", "max_output_tokens"), "override")

        assert expected == resolve_window("openai/gpt-4o", settings)

    def test_exact_override_beats_bare_override(self) -> None:
        """The override for the exact model string wins over the bare name's."""
        settings = BudgetSettings(window_overrides={"gpt-4o": 50_000, "azure/gpt-4o": 60_000})
        expected = 60_000

        assert expected == resolve_window("azure/gpt-4o", settings).window

    def test_event_beats_override(self) -> None:
        """The event's context_window wins over configuration and registry."""
        settings = BudgetSettings(window_overrides={"gpt-4o": 50_000})

        expected = WindowInfo("gpt-4o", 9_000, bundled("gpt-4o", "max_output_tokens"), "event")

        assert expected == resolve_window("gpt-4o", settings, event_window=9_000)

    def test_event_window_for_unknown_model(self, caplog: pytest.LogCaptureFixture) -> None:
        """An unknown model with an event window needs no fallback, so nothing is logged."""
        model = unknown_model()

        with caplog.at_level(logging.WARNING, logger=LOGGER):
            info = resolve_window(model, BudgetSettings(fallback_window=None), event_window=4_096)

        assert WindowInfo(model, 4_096, None, "event") == info
        assert not caplog.records

    def test_override_for_unknown_model(self, caplog: pytest.LogCaptureFixture) -> None:
        """An override makes an unknown model usable without a fallback warning."""
        model = unknown_model()

        with caplog.at_level(logging.WARNING, logger=LOGGER):
            info = resolve_window(model, BudgetSettings(window_overrides={model: 12_000}))

        assert WindowInfo(model, 12_000, None, "override") == info
        assert not caplog.records

    @pytest.mark.parametrize("bad", [0, -5])
    def test_non_positive_windows_are_ignored(self, bad: int) -> None:
        """A zero or negative window from the event or the overrides is skipped."""
        settings = BudgetSettings(window_overrides={"gpt-4o": bad})
        expected = WindowInfo("gpt-4o", 128_000, bundled("gpt-4o", "max_output_tokens"), "registry")

        assert expected == resolve_window("gpt-4o", settings, event_window=bad)


class TestFallback:
    def test_unknown_model_falls_back(self) -> None:
        """An unknown model gets the configured fallback window and no output limit."""
        model = unknown_model()

        info = resolve_window(model, BudgetSettings(fallback_window=20_000))

        assert WindowInfo(model, 20_000, None, "fallback") == info

    def test_resolution_logs_nothing(self, caplog: pytest.LogCaptureFixture) -> None:
        """Resolving is silent: the per-turn path warns once per conversation (tests/test_turns.py), not per call."""
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            for _ in range(3):
                resolve_window(unknown_model(), BudgetSettings())

        # LiteLLM's own DEBUG lines may pass through when an earlier test turned its logging on.
        assert not [r for r in caplog.records if r.name.startswith("compaction_worker")]

    @pytest.mark.parametrize(
        "model",
        ["", " ", "/", "//", "\x00", "🙂", "openai/", "../../etc/passwd", "a" * 100_000, "x/" * 500],
    )
    def test_weird_strings_never_raise(self, model: str) -> None:
        """Malformed model strings resolve to some positive window instead of raising."""
        info = resolve_window(model, BudgetSettings())

        assert info.window > 0
        assert info.source in {"registry", "fallback"}

    def test_unset_fallback_still_resolves(self) -> None:
        """With fallback_window unset the source still says fallback, so the caller can reject."""
        model = unknown_model()
        expected = WindowInfo(model, DEFAULT_FALLBACK_WINDOW, None, "fallback")

        assert expected == resolve_window(model, BudgetSettings(fallback_window=None))

    def test_known_model_without_fallback(self) -> None:
        """Rejecting unknown models does not affect known ones."""
        expected = WindowInfo("gpt-4o", 128_000, bundled("gpt-4o", "max_output_tokens"), "registry")

        assert expected == resolve_window("gpt-4o", BudgetSettings(fallback_window=None))

    def test_default_fallback_is_32768(self) -> None:
        """Reference 000 (fallbackContextWindow): without configuration an unknown model is assumed to have 32,768 tokens."""
        model = unknown_model()

        expected = WindowInfo(model, 32_768, None, "fallback")

        assert expected == resolve_window(model, BudgetSettings())


# Model strings people configure, each with the LiteLLM map entry that is the model's own
# (or, for a retired Gemini, its tier's current alias): the window must be that entry's.
POPULAR = [
    # OpenAI
    ("gpt-4o", "gpt-4o"),
    ("openai/gpt-4o-mini", "gpt-4o-mini"),
    ("gpt-4.1", "gpt-4.1"),
    ("o3-mini", "o3-mini"),
    ("gpt-5", "gpt-5"),
    # Anthropic
    ("claude-sonnet-4-5", "claude-sonnet-4-5"),
    ("anthropic/claude-haiku-4-5", "claude-haiku-4-5"),
    ("claude-3-5-sonnet-20241022", "anthropic.claude-3-5-sonnet-20241022-v2:0"),
    ("claude-3-5-haiku-20241022", "anthropic.claude-3-5-haiku-20241022-v1:0"),
    ("claude-3-7-sonnet-latest", "anthropic.claude-3-7-sonnet-20250219-v1:0"),
    ("anthropic/claude-3-haiku-20240307", "vertex_ai/claude-3-haiku@20240307"),
    # Gemini (1.5 and 2.0 are retired; LiteLLM's map keeps only the tiers' aliases)
    ("gemini-2.5-pro", "gemini/gemini-2.5-pro"),
    ("gemini/gemini-2.5-flash", "gemini/gemini-2.5-flash"),
    ("gemini-1.5-pro", "gemini/gemini-pro-latest"),
    ("gemini/gemini-1.5-flash", "gemini/gemini-flash-latest"),
    ("gemini-2.0-flash", "gemini/gemini-flash-latest"),
    ("vertex_ai/gemini-2.0-flash-lite", "gemini/gemini-flash-lite-latest"),
    # Mistral
    ("mistral/mistral-large-latest", "mistral/mistral-large-latest"),
    ("mistral-small-latest", "mistral/mistral-small-latest"),
    ("codestral-latest", "mistral/codestral-latest"),
    ("open-mistral-nemo", "mistral/open-mistral-nemo"),
    # Bedrock: plain, cross-region profiles (listed or not), route prefixes, regions
    ("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", "anthropic.claude-3-5-sonnet-20240620-v1:0"),
    ("bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0", "us.anthropic.claude-3-5-sonnet-20241022-v2:0"),
    ("bedrock/apac.anthropic.claude-3-5-sonnet-20241022-v2:0", "anthropic.claude-3-5-sonnet-20241022-v2:0"),
    ("us.anthropic.claude-sonnet-4-20250514-v1:0", "us.anthropic.claude-sonnet-4-20250514-v1:0"),
    (
        "bedrock/converse/us.anthropic.claude-3-7-sonnet-20250219-v1:0",
        "us.anthropic.claude-3-7-sonnet-20250219-v1:0",
    ),
    ("bedrock/anthropic.claude-3-haiku-20240307-v1:0", "vertex_ai/claude-3-haiku@20240307"),
    ("bedrock/us.meta.llama3-3-70b-instruct-v1:0", "us.meta.llama3-3-70b-instruct-v1:0"),
    ("bedrock/amazon.nova-pro-v1:0", "amazon.nova-pro-v1:0"),
    (
        "bedrock/us-west-2/mistral.mistral-large-2402-v1:0",
        "bedrock/us-west-2/mistral.mistral-large-2402-v1:0",
    ),
    # Vertex AI
    ("vertex_ai/claude-3-5-sonnet-v2@20241022", "anthropic.claude-3-5-sonnet-20241022-v2:0"),
    ("vertex_ai/claude-3-5-sonnet@20240620", "vertex_ai/claude-3-5-sonnet@20240620"),
    # Azure
    ("azure/gpt-4o", "azure/gpt-4o"),
    ("azure/gpt-4.1-mini", "azure/gpt-4.1-mini"),
    ("azure/o4-mini", "azure/o4-mini"),
    ("azure_ai/mistral-large-latest", "azure_ai/mistral-large-latest"),
    # OpenRouter: "<vendor>/<model>" in OpenRouter's own spelling
    ("openrouter/anthropic/claude-3.5-sonnet", "vertex_ai/claude-3-5-sonnet"),
    ("openrouter/anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),
    ("openrouter/openai/gpt-4o-mini", "gpt-4o-mini"),
    ("openrouter/google/gemini-2.5-pro", "gemini/gemini-2.5-pro"),
    ("openrouter/google/gemini-pro-1.5", "gemini/gemini-pro-latest"),
    ("openrouter/mistralai/mistral-large", "mistral/mistral-large-latest"),
    ("openrouter/deepseek/deepseek-chat", "deepseek/deepseek-chat"),
    # Groq (its Llama ids are in the map under another host)
    ("groq/llama-3.3-70b-versatile", "inferenceapis/llama-3.3-70b-versatile"),
    ("groq/llama-3.1-8b-instant", "inferenceapis/llama-3.1-8b-instant"),
    ("groq/openai/gpt-oss-120b", "groq/openai/gpt-oss-120b"),
    # Together AI
    (
        "together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo",
        "together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo",
    ),
    ("together_ai/deepseek-ai/DeepSeek-V3", "together_ai/deepseek-ai/DeepSeek-V3"),
    # Ollama: plain, tagged, the chat route
    ("ollama/llama3.1", "ollama/llama3.1"),
    ("ollama/llama3.1:8b", "ollama/llama3.1"),
    ("ollama/llama3:70b", "ollama/llama3:70b"),
    ("ollama_chat/mistral", "ollama/mistral"),
    # DeepSeek, bare
    ("deepseek-chat", "deepseek/deepseek-chat"),
]


def registry_window(key: str) -> int:
    entry = litellm.model_cost[key]
    window = entry.get("max_input_tokens") or entry.get("max_tokens")
    assert isinstance(window, int)
    return window


class TestPopularModels:
    def test_the_table_is_wide(self) -> None:
        """At least 30 strings, over every provider people configure."""
        prefixes = {
            "openrouter/",
            "bedrock/",
            "azure/",
            "groq/",
            "ollama/",
            "vertex_ai/",
            "mistral/",
            "gemini",
        }
        assert len(POPULAR) >= 30
        assert all(any(m.startswith(p) for m, _ in POPULAR) for p in prefixes)

    @pytest.mark.parametrize(("model", "canonical"), POPULAR, ids=[m for m, _ in POPULAR])
    def test_window_is_litellms_own_figure(self, model: str, canonical: str) -> None:
        """Issue 9: routing, host and region prefixes, tags and spellings resolve to LiteLLM's window for the model."""
        info = resolve_window(model, BudgetSettings())

        assert (info.window, info.source) == (registry_window(canonical), "registry")

    @pytest.mark.parametrize(
        "model",
        ["azure/my-gpt4-deployment", "gemini-1.0-pro", "groq/mixtral-8x7b-32768", "ollama/my-finetune:7b"],
    )
    def test_names_no_host_lists_still_fall_back(self, model: str) -> None:
        """A deployment name, a model retired before any entry that could speak for it, a model no host lists."""
        assert resolve_window(model, BudgetSettings()).source == "fallback"


class TestBaseName:
    @pytest.mark.parametrize(
        ("model", "base"),
        [
            ("bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet-20241022"),
            ("vertex_ai/claude-3-5-sonnet-v2@20241022", "claude-3-5-sonnet-20241022"),
            ("vertex_ai/claude-opus-4-6@default", "claude-opus-4-6"),
            ("openrouter/anthropic/claude-3.5-sonnet", "claude-3-5-sonnet"),
            ("openrouter/google/gemini-flash-1.5-8b", "gemini-1.5-flash-8b"),
            ("ollama/llama3.1:8b", "llama3.1"),
            ("bedrock/meta.llama3-1-70b-instruct-v1:0", "llama3-1-70b-instruct"),
            ("together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo", "qwen2.5-72b-instruct-turbo"),
            ("gpt-4.1", "gpt-4.1"),
            ("ft:gpt-4.1-2025-04-14", ""),
        ],
    )
    def test_prefixes_versions_and_tags_go(self, model: str, base: str) -> None:
        """Host, region and vendor prefixes, Bedrock and Vertex versions and Ollama tags go; dots in version numbers stay."""
        assert base_name(model) == base


class TestAcrossHosts:
    @pytest.fixture(autouse=True)
    def fresh_caches(self) -> Any:
        windows._base_index.cache_clear()
        windows._registry_cached.cache_clear()
        yield
        windows._base_index.cache_clear()
        windows._registry_cached.cache_clear()

    def test_the_window_most_hosts_list_wins(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """One host that caps a model's context does not decide its window; a tie takes the smaller."""
        chat = {"mode": "chat", "max_output_tokens": 100}
        cost = {
            "a/foo-9b": {**chat, "max_input_tokens": 128_000},
            "b/foo-9b": {**chat, "max_input_tokens": 128_000},
            "c/foo-9b": {**chat, "max_input_tokens": 8_000},
            "a/bar-2": {**chat, "max_input_tokens": 64_000},
            "b/bar-2": {**chat, "max_input_tokens": 32_000},
            "a/baz-1": {"mode": "embedding", "max_input_tokens": 8_000},
        }
        monkeypatch.setattr(_litellm, "model_map", lambda: cost)

        found = [resolve_window(f"acme/{m}", BudgetSettings()) for m in ("foo-9b", "bar-2", "baz-1")]

        assert [(i.window, i.source) for i in found] == [
            (128_000, "registry"),
            (32_000, "registry"),
            (32_768, "fallback"),
        ]
