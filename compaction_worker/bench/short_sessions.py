"""Short sessions for the typed-canary benchmark: 20 things the user set in ~2,200 tokens of chatter.

An outside suite plants 20 items (safety rules, hard constraints, facts, goal state, preferences)
in the user turns of a short session, among remarks that state nothing needed and assistant
acknowledgments, and holds the compacted output to 10-30% of the session's tokens. This module
puts such sessions together from a seed, out of ``bench/canaries.py``'s templates and remarks:
the task early (the first message is sometimes a remark, which a product must not take for the
task), 4 items of each kind, 2-4 of them changed later in the session and one more in the turns
added before the second compaction, and remarks until the session is 2,100-2,300 tokens.

:func:`found` and :func:`marked_only` are the scoring: an item is kept when one sentence of the
output holds its canary and its key words; a changed item is resolved when its new value is kept
and its old value is gone or only on a line (or under a heading) that says it no longer holds.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compaction_worker.bench.canaries import (
    ACKS,
    ASKS,
    FILLER,
    KINDS,
    NOTES,
    TASK_SUBJECTS,
    TASKS,
    TEMPLATES,
    TOOLS,
    Said,
    Values,
    said,
)
from compaction_worker.contracts.history import Entry
from compaction_worker.testing import Chat

PER_KIND = 4
TOKENS = (2_000, 2_400)
"""The range a generated session's tokens fall in (every rendered message, ``counter.message``)."""


@dataclass(slots=True)
class Item:
    """One thing the user set; ``change`` is the later sentence that replaces its value, said in the
    session (``changed_in`` 0) or in the turns added before the second compaction (1)."""

    kind: str
    said: Said
    change: Said | None = None
    changed_in: int | None = None

    def current(self, round_index: int) -> Said:
        """What holds after the turns of round ``round_index`` (0: the session itself)."""
        if self.change is not None and self.changed_in is not None and self.changed_in <= round_index:
            return self.change
        return self.said

    def superseded(self, round_index: int) -> bool:
        return self.current(round_index) is not self.said


@dataclass(slots=True)
class ShortSession:
    seed: int
    entries: list[Entry]
    """The session as stored, one entry a message."""
    more: list[Entry]
    """The turns added before the second compaction: remarks and one change."""
    items: list[Item]
    task: Said
    tokens: int
    """Of the session's messages, each counted with ``counter.message``."""
    first_is_remark: bool


@dataclass
class _Turn:
    said: list[str] = field(default_factory=list)
    reply: str = ""
    tool: tuple[str, dict[str, Any], str] | None = None


def session(seed: int, counter: Any) -> ShortSession:
    """A short session from ``seed``: the task early, 20 items, 2-4 of them changed later, filler
    around them until the session is 2,100-2,300 tokens; and the turns added before round 2."""
    r = random.Random(seed)
    values = Values(r)
    items: list[Item] = []
    for kind in KINDS:
        for make in r.sample(TEMPLATES[kind](), PER_KIND):
            first, change = make(values)
            items.append(Item(kind, first, change))
    subject = r.choice(TASK_SUBJECTS)
    task_text = r.choice(TASKS).format(s=subject)
    task = said(task_text, f"{subject} exports", "queue")
    fillers = _Deck(r, FILLER)
    asks = _Deck(r, ASKS)

    # The order things are said: items shuffled, each change at least four items after its item.
    order: list[tuple[str, Item]] = [("item", item) for item in r.sample(items, len(items))]
    changeable = [i for i in items if i.change is not None]
    changed = r.sample(changeable, r.randint(3, 5))
    for item in changed[1:]:
        item.changed_in = 0
        at = next(k for k, (_, it) in enumerate(order) if it is item)
        order.insert(r.randint(min(at + 4, len(order)), len(order)), ("change", item))
    later = changed[0]
    later.changed_in = 1

    turns: list[_Turn] = []
    first_is_remark = r.random() < 0.5
    if first_is_remark:
        turns.append(_Turn([fillers.draw()], r.choice(ACKS)))
    turns.append(_Turn([task.text], "Understood. I'll start with the exporter's queue settings."))
    while order:
        turn = _Turn()
        for _ in range(min(len(order), r.choice([1, 1, 2]))):
            what, planted = order.pop(0)
            turn.said.append(planted.said.text if what == "item" else _change(planted).text)
        if r.random() < 0.3:
            turn.said.insert(r.randint(0, len(turn.said)), fillers.draw())
        turn.reply = r.choice(ACKS) if r.random() < 0.7 else r.choice(NOTES)
        turns.append(turn)
    for tool in r.sample(TOOLS, 2):
        turns[r.randint(2, len(turns) - 1)].tool = tool

    # Pad with remarks (some with a question) until the session reaches its size.
    want = r.randint(2_100, 2_300)
    while _tokens(turns, counter) < want:
        remark = fillers.draw()
        turn = turns[r.randint(1, len(turns) - 1)]
        if r.random() < 0.5 and remark not in turn.said:
            turn.said.insert(r.randint(0, len(turn.said)), remark)
        else:
            words = [remark] + ([asks.draw()] if r.random() < 0.3 else [])
            reply = r.choice(ACKS) if r.random() < 0.6 else r.choice(NOTES)
            turns.insert(r.randint(2, len(turns)), _Turn(words, reply))
    chat = _chat(turns, Chat(1, counter))
    more = [
        _Turn([fillers.draw()], r.choice(ACKS)),
        _Turn([_change(later).text], "Updated, thanks."),
        _Turn([fillers.draw(), asks.draw()], r.choice(NOTES)),
    ]
    extra = _chat(more, Chat(len(chat.entries) + 1, counter))
    tokens = counter.messages(e.message for e in chat.entries)
    return ShortSession(seed, chat.entries, extra.entries, items, task, tokens, first_is_remark)


def _change(item: Item) -> Said:
    assert item.change is not None
    return item.change


class _Deck:
    """Draws from ``pool`` without repeating until every one has been drawn."""

    def __init__(self, r: random.Random, pool: Sequence[str]) -> None:
        self.r, self.pool = r, list(pool)
        self.left: list[str] = []

    def draw(self) -> str:
        if not self.left:
            self.left = self.r.sample(self.pool, len(self.pool))
        return self.left.pop()


def _chat(turns: Iterable[_Turn], chat: Chat) -> Chat:
    for i, turn in enumerate(turns):
        chat.user(" ".join(turn.said))
        if turn.tool:
            name, args, output = turn.tool
            chat.tool(f"call_{chat.start + i}", name, args, output)
        chat.assistant(turn.reply)
    return chat


def _tokens(turns: Sequence[_Turn], counter: Any) -> int:
    chat = _chat(turns, Chat(1, counter))
    return int(counter.messages(e.message for e in chat.entries))


# --- scoring -------------------------------------------------------------------------------------

MARKS = ("no longer current", "superseded", "changed later")
"""Words that say a line (or the section under a heading) no longer holds."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _pattern(value: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-]){re.escape(value)}(?![\w-])", re.IGNORECASE)


def says(value: str, text: str) -> bool:
    """Whether ``text`` says ``value`` anywhere (as a whole: "eu-west-1" is not in "eu-west-12")."""
    return bool(_pattern(value).search(text))


def found(said: Said, text: str) -> bool:
    """Whether one sentence of ``text`` holds ``said``'s canary and all its key words."""
    canary = _pattern(said.canary)
    keys = [_pattern(k) for k in said.keys]
    for line in text.splitlines():
        if not canary.search(line):
            continue
        for sentence in _SENTENCE_END.split(line):
            if canary.search(sentence) and all(k.search(sentence) for k in keys):
                return True
    return False


def marked_only(value: str, text: str) -> bool:
    """Whether every line that says ``value`` is marked as no longer holding (or sits under a heading
    that is); true when no line says it."""
    canary = _pattern(value)
    heading_marked = False
    for line in text.splitlines():
        stripped = line.strip()
        marked = any(m in stripped.lower() for m in MARKS)
        if not stripped:
            heading_marked = False
        elif _is_heading(stripped):
            heading_marked = marked
        if canary.search(line) and not (marked or heading_marked):
            return False
    return True


def _is_heading(line: str) -> bool:
    if line.startswith(("- ", "* ")):
        return False
    return line.startswith("#") or line.endswith(":") or (line.startswith("[") and line.endswith("]"))
