"""The summary as checked items: a JSON schema, a lenient parser, the check, changes, and Markdown.

A model answers with sections of short items, each citing the numbered transcript blocks it
comes from (docs/design.md, "Summaries"). An item whose identifiers or numbers are not in the
turns it cites is refused; a reply that does not parse, or cites a turn outside its span, is
refused whole. A later compaction sends the current items with their ids and gets changes back
(added, updated with ``replaces``, ``resolved``): an item that did not change keeps its bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from compaction_worker.summaries.artifacts import item_core, scan_items
from compaction_worker.summaries.carry import distinctive_terms, is_distinctive

SECTIONS: Final[tuple[tuple[str, str, str], ...]] = (
    ("goals", "Goals and constraints", "what the user wants; requirements, preferences, limits"),
    ("decisions", "Decisions and reasons", "what was decided and why"),
    ("artifacts", "Artifacts and paths", "files, branches, URLs, ids, with exact paths"),
    ("facts", "Facts learned from tools", "tool and command results later work relies on"),
    ("errors", "Errors", "exact error messages, the commands that produced them, their outcome"),
    ("state", "Current state", "where the work stands at the end"),
    ("next", "Next steps", "what remains to do, the user's latest request first"),
)
KEYS: Final = tuple(key for key, _, _ in SECTIONS)
TITLES: Final = {key: title for key, title, _ in SECTIONS}
RESOLVED_TITLE: Final = "Resolved"
_PREFIX: Final = {"goals": "g", "decisions": "d", "artifacts": "a", "facts": "f", "errors": "e", "state": "s"}
_ITEM_TOKENS: Final = 12
"""What an item costs a reply at the least (its text, its turns, the JSON around them): sets the counts."""
MAX_CITES: Final = 6


class ReplyRefused(ValueError):
    """The reply cannot be used: it does not parse, or it cites turns outside its span."""


@dataclass(frozen=True, slots=True)
class Item:
    """One short item of a section, with the turns it cites (``turn_seq``s) and its standing."""

    id: str
    section: str
    text: str
    cites: tuple[int, ...] = ()
    resolved: bool = False
    replaces: str | None = None

    def encode(self) -> str:
        """The stored form: the same item always has the same bytes."""
        data: dict[str, Any] = {"id": self.id, "s": self.section, "t": self.text, "c": list(self.cites)}
        if self.resolved:
            data["r"] = 1
        if self.replaces:
            data["p"] = self.replaces
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, raw: str) -> Item:
        data = json.loads(raw)
        return cls(
            data["id"], data["s"], data["t"], tuple(data.get("c", ())), bool(data.get("r")), data.get("p")
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """How many items a section may hold and how long an item may be, from the room a reply has."""

    per_section: int
    max_chars: int

    @classmethod
    def for_room(cls, tokens: int) -> Limits:
        """Counts and lengths a reply of ``tokens`` can finish: a small room gets fewer, shorter items."""
        per_section = max(1, min(8, tokens // (len(SECTIONS) * _ITEM_TOKENS)))
        return cls(per_section, max(60, min(200, tokens // 2)))


ALWAYS_SAID: Final = ("state",)
"""Sections a reply always fills: a span always ends somewhere. A small model under a grammar that
allows every list empty answers with empty lists."""
FIRST_SAID: Final = ("goals", "facts")
"""Sections a first summary (no current items) fills too: a span always has a purpose and a fact."""


def json_schema(limits: Limits, *, anchored: bool = False) -> dict[str, Any]:
    """The reply's JSON schema: the sections as bounded lists of items, and the ids resolved. What a
    span always says (:data:`ALWAYS_SAID`, and :data:`FIRST_SAID` when nothing is ``anchored``) holds
    at least one item; what the item says is still checked against its turns."""
    item = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": limits.max_chars},
            "turns": {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
            "replaces": {"type": "string"},
        },
        "required": ["text", "turns"],
    }
    said = ALWAYS_SAID if anchored else ALWAYS_SAID + FIRST_SAID
    properties: dict[str, Any] = {
        key: {"type": "array", "items": item, "maxItems": limits.per_section}
        | ({"minItems": 1} if key in said else {})
        for key in KEYS
    }
    properties["resolved"] = {"type": "array", "items": {"type": "string"}, "maxItems": 16}
    return {"type": "object", "properties": properties, "required": list(KEYS)}


def response_format(limits: Limits, *, grammar: bool = False, anchored: bool = False) -> dict[str, Any]:
    """``response_format`` as LiteLLM passes it on: OpenAI's structured outputs shape, or with
    ``grammar`` the ``json_object`` shape with its schema, which llama.cpp's server turns into a grammar."""
    if grammar:
        return {"type": "json_object", "schema": json_schema(limits, anchored=anchored)}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "conversation_summary",
            "schema": json_schema(limits, anchored=anchored),
            "strict": False,
        },
    }


def instructions(limits: Limits, *, anchored: bool) -> str:
    """The system prompt that asks for the JSON."""
    sections = "\n".join(f'- "{key}": {what}' for key, _, what in SECTIONS)
    changes = (
        "\n\nThe current items of the memory are listed with their ids. Do not repeat them. Return only "
        'changes: a new item as usual; an item that changed as a new item with "replaces": "<its id>"; '
        'the ids of items that are done or no longer true in "resolved". Leave the rest out.'
        if anchored
        else ""
    )
    return (
        "You write the memory of a conversation between a user and an AI assistant. The assistant "
        "continues from it and will not see the transcript again.\n\n"
        "Reply with one JSON object and nothing else. Its keys are these lists:\n"
        f"{sections}\n"
        f'and "resolved", a list of ids. Each item is {{"text": "...", "turns": [n, ...]}}: one short '
        f"statement (at most {limits.max_chars} characters) and the numbers of the transcript blocks "
        f"([n]) it comes from. At most {limits.per_section} items a list; an empty list when there is "
        "nothing to say.\n\n"
        "Rules:\n"
        "- Keep identifiers, numbers, file paths, commands, URLs and error messages verbatim, exactly "
        "as the cited turns write them. Cite every turn an item takes them from.\n"
        "- Write nothing that the transcript does not say."
        f"{changes}"
    )


# --- parsing --------------------------------------------------------------------------------

_FENCE: Final = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)(?:```|$)", re.DOTALL)


def parse(reply: str, *, cut: bool = False) -> dict[str, Any]:
    """The reply's JSON object, leniently: in a code fence, with text around it, in single quotes
    where that is safe; ``cut`` (the reply stopped at its length limit): the items it completed."""
    text = reply.strip()
    fenced = _FENCE.search(text)
    if fenced and "{" in fenced.group(1):
        text = fenced.group(1).strip()
    start = text.find("{")
    if start < 0:
        raise ReplyRefused("the reply holds no JSON object")
    text = text[start:]
    for candidate in (text, _single_quotes(text)):
        if candidate is None:
            continue
        try:
            value, _ = json.JSONDecoder().raw_decode(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
        raise ReplyRefused("the reply's JSON is not an object")
    if cut:
        value = _prefix(text)
        if value is not None:
            return value
    raise ReplyRefused("the reply's JSON does not parse" + (" (cut at its length limit)" if cut else ""))


def _single_quotes(text: str) -> str | None:
    """``text`` with single quotes as JSON's, when no double quote or apostrophe inside a word could be
    mistaken for one; else None."""
    if '"' in text or re.search(r"\w'\w", text):
        return None
    return text.replace("'", '"')


def _prefix(text: str) -> dict[str, Any] | None:
    """The longest prefix of a cut JSON object that ends after a complete item, closed."""
    for end, closing in reversed(_item_ends(text)[-64:]):
        try:
            value = json.loads(text[:end] + closing)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _item_ends(text: str) -> list[tuple[int, str]]:
    """Where a value inside a list ends, and what closes everything still open there."""
    stack: list[str] = []
    ends: list[tuple[int, str]] = []
    in_string = escaped = False
    for i, char in enumerate(text):
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]":
            if not stack:
                break
            stack.pop()
            if stack and stack[-1] == "]":
                ends.append((i + 1, "".join(reversed(stack))))
    return ends


# --- from a reply to items ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Changes:
    """What one reply changes: the items it adds (some replacing an earlier one), the ids it resolves,
    and the items refused by the check, with why."""

    added: tuple[Item, ...]
    resolved: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]


def read_changes(
    data: Mapping[str, Any],
    blocks: Sequence[str],
    seqs: Sequence[int],
    current: Sequence[Item],
    limits: Limits,
) -> Changes:
    """The reply's items, each checked against the blocks it cites (``blocks[i]`` is block ``i + 1``,
    said in turn ``seqs[i]``); raises :class:`ReplyRefused` when a cite is outside the span."""
    known = {item.id: item for item in current}
    numbers = _next_numbers(current)
    added: list[Item] = []
    refused: list[tuple[str, str]] = []
    for key in KEYS:
        raw = data.get(key) or data.get(TITLES[key]) or []
        if not isinstance(raw, list):
            continue
        for entry in raw[: limits.per_section]:
            text, turns, replaces = _fields(entry)
            if not text:
                continue
            outside = [t for t in turns if not 1 <= t <= len(blocks)]
            if outside:
                raise ReplyRefused(f"an item cites turns outside its span (1-{len(blocks)}): {outside}")
            text = " ".join(text.split())[: limits.max_chars]
            replaced = known.get(replaces) if replaces else None
            earlier = replaced.text if replaced is not None else ""
            missing = unsupported(text, "\n".join([*(blocks[t - 1] for t in turns), earlier]))
            if missing:
                # A small model often cites the wrong turn, or none: what the span says is kept, cited
                # where it is said; what the span never says is refused.
                nowhere = unsupported(text, "\n".join([*blocks, earlier]))
                if nowhere:
                    refused.append((text, f"not in the turns it summarizes: {', '.join(nowhere[:3])}"))
                    continue
                turns = sorted({*turns, *_saying(missing, blocks)})
            numbers[key] = numbers.get(key, 0) + 1
            added.append(
                Item(
                    f"{_PREFIX.get(key, key[0])}{numbers[key]}",
                    key,
                    text,
                    tuple(sorted({seqs[t - 1] for t in turns}))[:MAX_CITES],
                    replaces=replaced.id if replaced is not None else None,
                )
            )
    resolved = data.get("resolved") or []
    ids = (
        tuple(str(r) for r in resolved if isinstance(r, str | int) and str(r) in known)
        if isinstance(resolved, list)
        else ()
    )
    return Changes(tuple(added), ids, tuple(refused))


def _saying(terms: Sequence[str], blocks: Sequence[str]) -> set[int]:
    """The blocks (numbered from 1) where each term is first said (one the replaced item held: none)."""
    return {i for term in terms for i in [next((i for i, b in enumerate(blocks, 1) if term in b), 0)] if i}


def _fields(entry: Any) -> tuple[str, list[int], str | None]:
    if isinstance(entry, str):
        return entry.strip(), [], None
    if not isinstance(entry, Mapping):
        return "", [], None
    text = entry.get("text")
    turns = entry.get("turns") or entry.get("turn") or []
    if isinstance(turns, int | str):
        turns = [turns]
    cited: list[int] = []
    for turn in turns if isinstance(turns, list) else []:
        try:
            cited.append(int(str(turn).strip("[] ")))
        except ValueError:
            continue
    replaces = entry.get("replaces")
    return (text.strip() if isinstance(text, str) else ""), cited, (str(replaces) if replaces else None)


def _next_numbers(items: Sequence[Item]) -> dict[str, int]:
    numbers: dict[str, int] = {}
    for item in items:
        digits = item.id.lstrip("abcdefghijklmnopqrstuvwxyz")
        if digits.isdigit():
            numbers[item.section] = max(numbers.get(item.section, 0), int(digits))
    return numbers


_PUNCT: Final = "`'\".,;:()[]{}!?"
_NUMBER: Final = re.compile(r"(?<![\w.])\d+(?:[.,:]\d+)*")


def unsupported(text: str, source: str) -> list[str]:
    """The identifiers and numbers of ``text`` that ``source`` does not hold (what an identifier is:
    the artifact ledger's items and the distinctive terms, ``summaries.artifacts``/``carry``)."""
    terms = [item_core(item) for _, item in scan_items([{"role": "assistant", "content": text}])]
    terms += distinctive_terms(text)
    # A term may join words ("80738 messages", a command): each distinctive word of it must be there.
    words = {word.strip(_PUNCT) for term in terms for word in term.split()}
    wanted = {word for word in words if is_distinctive(word)} | set(_NUMBER.findall(text))
    return sorted(w for w in wanted if w and w not in source)


def apply(current: Sequence[Item], changes: Changes) -> list[Item]:
    """The items after ``changes``: an unchanged item is the same object (its bytes kept), a replaced
    one leaves, a resolved one is marked, the added ones come last."""
    replaced = {item.replaces for item in changes.added if item.replaces}
    resolved = set(changes.resolved)
    out = [
        replace(item, resolved=True) if item.id in resolved and not item.resolved else item
        for item in current
        if item.id not in replaced
    ]
    return [*out, *changes.added]


def merge(layers: Sequence[Sequence[Item]]) -> list[Item]:
    """Items stored across chunks, oldest chunk first, as one list: a later copy of an id wins, a
    replaced id leaves."""
    by_id: dict[str, Item] = {}
    for layer in layers:
        for item in layer:
            if item.replaces:
                by_id.pop(item.replaces, None)
            by_id.pop(item.id, None)
            by_id[item.id] = item
    return list(by_id.values())


def render(items: Sequence[Item]) -> str:
    """The items as Markdown, sections in their fixed order, items in theirs; the resolved last."""
    parts: list[str] = []
    for key in KEYS:
        lines = [f"- {item.text}" for item in items if item.section == key and not item.resolved]
        if lines:
            parts.append(f"## {TITLES[key]}\n" + "\n".join(lines))
    done = [f"- {item.text}" for item in items if item.resolved]
    if done:
        parts.append(f"## {RESOLVED_TITLE}\n" + "\n".join(done))
    return "\n".join(parts)


def fit(items: Sequence[Item], budget: int, count: Callable[[str], int]) -> tuple[list[Item], list[Item]]:
    """The items whose rendering fits ``budget`` tokens, and those let go: the oldest resolved first,
    then the oldest of the sections that matter least (state and steps are rewritten each time)."""
    kept = list(items)
    dropped: list[Item] = []
    order = ["facts", "artifacts", "errors", "decisions", "goals", "state", "next"]
    while kept and count(render(kept)) > budget:
        victim = next((i for i in kept if i.resolved), None)
        if victim is None:
            victim = min(
                kept, key=lambda i: (order.index(i.section) if i.section in order else -1, kept.index(i))
            )
        kept.remove(victim)
        dropped.append(victim)
    return kept, dropped


def listing(items: Sequence[Item]) -> str:
    """The current items as the prompt shows them: ``id [section] text``, one a line."""
    return "\n".join(
        f"{item.id} [{item.section}{', resolved' if item.resolved else ''}] {item.text}" for item in items
    )
