"""The one place that imports LiteLLM, set up for a process without internet access.

Why this exists: on import LiteLLM fetches its model map from GitHub (with retries and
backoff, several seconds offline) unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, so the
variable must be set before the first ``import litellm`` anywhere in the process. And
tiktoken downloads its encodings on first use unless ``TIKTOKEN_CACHE_DIR`` points at a
copy: LiteLLM bundles o200k_base, cl100k_base and p50k_base and points tiktoken at them,
but only when its ``default_encoding`` module is imported, which ``import litellm`` no
longer does (it is lazy). Importing it here, eagerly, makes every encoding we use
available offline before anything asks for one, and fixes the variable once instead of
whenever some LiteLLM code path first happens to run.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm

try:
    # Imported for its side effect: it sets TIKTOKEN_CACHE_DIR to the bundled files (or to
    # CUSTOM_TIKTOKEN_CACHE_DIR), overriding any value already there, exactly as LiteLLM
    # would later on its own.
    import litellm.litellm_core_utils.default_encoding
except ImportError:  # pragma: no cover - the module moved in a LiteLLM release
    _bundled = resources.files(litellm).joinpath("litellm_core_utils", "tokenizers")
    os.environ["TIKTOKEN_CACHE_DIR"] = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR") or str(_bundled)

# "Provider List: ..." banners on stdout for every unmapped model otherwise.
litellm.suppress_debug_info = True

TIKTOKEN_CACHE_DIR = Path(os.environ["TIKTOKEN_CACHE_DIR"])
"""Where tiktoken reads its encodings from in this process."""

__all__ = ["TIKTOKEN_CACHE_DIR", "litellm"]
