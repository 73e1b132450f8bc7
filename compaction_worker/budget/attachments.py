"""File attachments fitted to the room a conversation has left: a pure helper for producers.

Reference 004's aggregate file budget: files are previewed, cut in proportion or dropped
with a notice so that together they fit (:func:`fit_files`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

FILE_READ_BUDGET_PERCENT: Final = 0.6
"""The share of the remaining context that file attachments may use (reference 004)."""
FILE_FAST_PATH_SIZE: Final = 100 * 1024
"""UTF-8 bytes under which a file may skip counting (reference 004: 102,400)."""
FILE_PREVIEW_MODE_SIZE: Final = 5 * 1024 * 1024
"""UTF-8 bytes over which a file is only previewed (reference 004: 5,242,880)."""
FILE_PREVIEW_CHARS: Final = 2_000
"""Characters a preview keeps (reference 004)."""
MIN_FILE_TOKENS: Final = 64
"""The least share of the budget worth keeping a head for; below it the file is dropped."""

_ATTEMPTS: Final = 4
"""Re-cuts when a head turns out denser in tokens than its file's average."""
_SNAP: Final = 0.9
"""A head ends at a line break when one lies in its last tenth."""

Action = Literal["kept", "previewed", "truncated", "dropped"]


@dataclass(frozen=True, slots=True)
class FittedFile:
    """One file as it should be attached: whole, previewed, cut to a head, or only a notice."""

    name: str
    text: str
    """What to attach: the file, or its head and a notice, or (dropped) the notice alone."""
    original_tokens: int | None
    """Tokens of the whole file; None when it was not counted (previewed, or on the fast path)."""
    tokens: int
    """Tokens of ``text``, notice included; for a file kept on the fast path an upper bound."""
    action: Action


def file_budget(
    window: int, current_tokens: int, max_output_tokens: int, fraction: float = FILE_READ_BUDGET_PERCENT
) -> int:
    """Tokens the files of the next request may use: a fraction of what the window has left.

    Reference 004's ``calculateFileTokenBudget``: ``floor((window - current - max_output) *
    fraction)``, 0 when nothing (or less than nothing) remains.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be between 0 and 1, not {fraction}")
    remaining = window - current_tokens - max_output_tokens
    return math.floor(remaining * fraction) if remaining > 0 else 0


def notices_cost(files: Mapping[str, str], count: Callable[[str], int]) -> int:
    """Tokens of every file's dropped notice: the least budget :func:`fit_files` always keeps to."""
    return sum(count(_dropped_notice(name, text)) for name, text in files.items())


def fit_files(
    files: Mapping[str, str],
    budget_tokens: int,
    count: Callable[[str], int],
    *,
    max_tokens_per_byte: float | None = None,
) -> list[FittedFile]:
    """The files, in order, fitted to ``budget_tokens`` as ``count`` counts (see the module's rules).

    ``max_tokens_per_byte`` is an upper bound of ``count(text)`` per UTF-8 byte of ``text``
    (rounded up per file), and enables the fast path. A BPE tokenizer never exceeds 1 (each
    token is at least one byte), so a :class:`~compaction_worker.budget.tokens.TokenCounter`'s
    bound is its multiplier. Without it every file is counted.
    """
    budget = max(0, budget_tokens)
    parts = [_Part(name, text) for name, text in files.items()]
    bound: dict[int, int] = {}
    if max_tokens_per_byte is not None:
        bound = {
            id(p): math.ceil(p.bytes * max_tokens_per_byte) for p in parts if p.bytes < FILE_FAST_PATH_SIZE
        }
    for p in parts:
        if id(p) not in bound:
            p.measure(count)
    if bound:
        if sum(bound.get(id(p), p.cost) for p in parts) <= budget:
            return [
                FittedFile(p.name, p.text, None, bound[id(p)], "kept") if id(p) in bound else p.whole()
                for p in parts
            ]
        for p in parts:
            if id(p) in bound:
                p.measure(count)
    if sum(p.cost for p in parts) <= budget:
        return [p.whole() for p in parts]
    return _fit_over_budget(parts, budget, count)


class _Part:
    """A file on its way through :func:`fit_files`: what may be cut of it, and its costs."""

    __slots__ = ("body", "body_tokens", "bytes", "cost", "name", "preview", "text", "tokens")

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        # More characters than the limit has bytes: no need to encode a huge text to know.
        self.bytes = len(text) if len(text) > FILE_PREVIEW_MODE_SIZE else _utf8_len(text)
        self.preview = self.bytes > FILE_PREVIEW_MODE_SIZE
        self.body = text[:FILE_PREVIEW_CHARS] if self.preview else text
        """The text a head is cut from: the file, or its preview."""
        self.tokens: int | None = None
        """Tokens of the whole file, once counted (never for a preview)."""
        self.body_tokens = 0
        self.cost = 0
        """Tokens of the file as attached when it fits: whole, or the preview and its notice."""

    def measure(self, count: Callable[[str], int]) -> None:
        if self.preview:
            self.body_tokens = count(self.body)
            self.cost = count(self.compose(self.body, self.body_tokens))
        else:
            self.tokens = self.body_tokens = self.cost = count(self.text)

    def compose(self, head: str, head_tokens: int) -> str:
        """A head of the body and the notice that says what it is."""
        if self.preview:
            notice = (
                f"[... preview: the first {len(head):,} of {len(self.text):,} characters of "
                f"{self.name}, a file over {FILE_PREVIEW_MODE_SIZE // 2**20} MB ...]"
            )
        else:
            notice = (
                f"[... truncated: kept {head_tokens:,} of {self.body_tokens:,} tokens of {self.name} ...]"
            )
        return f"{head}\n{notice}"

    def whole(self) -> FittedFile:
        """The file as attached when it fits (measured)."""
        if self.preview:
            return FittedFile(
                self.name, self.compose(self.body, self.body_tokens), None, self.cost, "previewed"
            )
        return FittedFile(self.name, self.text, self.tokens, self.cost, "kept")

    def dropped(self, count: Callable[[str], int]) -> FittedFile:
        notice = _dropped_notice(self.name, self.text)
        return FittedFile(self.name, notice, self.tokens, count(notice), "dropped")


def _fit_over_budget(parts: list[_Part], budget: int, count: Callable[[str], int]) -> list[FittedFile]:
    """Cut every file to the same fraction of its tokens; drop those whose share is too small."""
    drop = {id(p): p.dropped(count) for p in parts}
    # Files that cost no more than their dropped notice are kept whole: cheaper than dropping.
    whole = {id(p) for p in parts if p.cost <= drop[id(p)].tokens}
    # The notice of a cut file, with its largest numbers: about what a cut will pay for it.
    notice = {id(p): count(p.compose("", p.body_tokens)) for p in parts if id(p) not in whole}
    # Smallest share first: dropping a file frees room, so the others' shares grow.
    queue = sorted((p for p in parts if id(p) not in whole), key=lambda p: p.body_tokens)
    fixed = sum(p.cost for p in parts if id(p) in whole) + sum(notice[id(p)] for p in queue)
    body_tokens = sum(p.body_tokens for p in queue)
    first = 0
    ratio = (budget - fixed) / max(1, body_tokens)
    while first < len(queue) and ratio * queue[first].body_tokens < MIN_FILE_TOKENS:
        fixed += drop[id(queue[first])].tokens - notice[id(queue[first])]
        body_tokens -= queue[first].body_tokens
        first += 1
        ratio = (budget - fixed) / max(1, body_tokens)
    dropped, cut = queue[:first], queue[first:]
    fitted: dict[int, FittedFile] = {id(p): p.whole() for p in parts if id(p) in whole}
    fitted |= {id(p): drop[id(p)] for p in dropped}
    for p in cut:
        if ratio >= 1.0:  # once others were dropped, the rest may fit whole
            fitted[id(p)] = p.whole()
            continue
        share = math.floor(ratio * p.body_tokens)
        fitted[id(p)] = _cut(p, share, share + notice[id(p)], count) or drop[id(p)]
    result = [fitted[id(p)] for p in parts]
    return _within(result, [drop[id(p)] for p in parts], budget)


def _cut(part: _Part, share: int, allowed: int, count: Callable[[str], int]) -> FittedFile | None:
    """A head of the part's body with its notice, within ``allowed`` tokens; None if none fits."""
    body = part.body
    n = len(body) * share // max(1, part.body_tokens)
    for _ in range(_ATTEMPTS):
        head = _head(body, n)
        if not head:
            return None
        head_tokens = count(head)
        text = part.compose(head, head_tokens)
        tokens = count(text)
        if tokens <= allowed:
            action: Action = "previewed" if part.preview else "truncated"
            return FittedFile(part.name, text, part.tokens, tokens, action)
        # Denser than the file's average: aim lower by what the head cost over its share.
        aim = max(0, head_tokens - (tokens - allowed))
        n = min(len(head) - 1, math.floor(len(head) * aim / max(1, head_tokens) * 0.95))
    return None


def _within(result: list[FittedFile], drops: list[FittedFile], budget: int) -> list[FittedFile]:
    """Drop files, largest saving first, while the total is over the budget (a guard; rarely acts)."""
    result = list(result)
    while sum(f.tokens for f in result) > budget:
        savings = [f.tokens - d.tokens for f, d in zip(result, drops, strict=True)]
        best = max(range(len(result)), key=lambda i: savings[i])  # the first of equals
        if savings[best] <= 0:
            break
        result[best] = drops[best]
    return result


def _head(body: str, n: int) -> str:
    """The first ``n`` characters, ending at a line break when one is close to the cut."""
    if n <= 0:
        return ""
    if n >= len(body) or body[n] == "\n":
        return body[:n]
    nl = body.rfind("\n", 0, n)
    return body[:nl] if nl >= math.ceil(n * _SNAP) else body[:n]


def _dropped_notice(name: str, text: str) -> str:
    return f"[... dropped: {name} ({len(text):,} characters) did not fit the file budget ...]"


def _utf8_len(text: str) -> int:
    # surrogatepass: a lone surrogate (from a bad decode upstream) must not raise here.
    return len(text.encode("utf-8", "surrogatepass"))
