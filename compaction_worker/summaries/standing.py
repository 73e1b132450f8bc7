"""The conversation's standing state: the rules, constraints, preferences, goals, decisions and facts
the user stated, read from the user's own words, verbatim, each at its current value.

A summary paraphrases and a later summary paraphrases the paraphrase: a rule the user set at
turn 3 is a clause by the second compaction and gone by the third. So what the user *set* is
read deterministically (no LLM: it must hold during an outage too) from every user message,
kept as the sentence the user wrote with its kind and turn, carried from compaction to
compaction as data, and rendered in the summary turn under ``STANDING_HEADER``.

Update-aware: a later sentence about the same subject ("raise the cap to 800" after "keep the
cap at 500") makes the earlier one superseded; superseded items are shown apart, as no longer
current, and are the first to go when space is short. Then facts and preferences, then
decisions and goals; constraints and rules go last (:data:`TIERS`; docs/design.md, "What stays
when not everything fits").
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final, cast

from compaction_worker.summaries.sentences import (
    KINDS,
    MAX_SENTENCE_CHARS,
    VALUE,
    Kind,
    classify,
    sentences,
)

TIERS: Final[Mapping[Kind, int]] = {
    "rule": 1,
    "constraint": 1,
    "goal": 2,
    "decision": 2,
    "preference": 4,
    "fact": 4,
}
"""Each kind's place in the order of value (``strategies.allocation.Tier``): rules and constraints
first, then goals and decisions, then (after the agent's newest step) preferences and facts."""

STANDING_HEADER = "[Standing state]"
INTRO = "What the user set, in their own words; each holds until a later message changes it."
_TITLES: Final[Mapping[Kind, str]] = {
    "rule": "Rules",
    "constraint": "Constraints",
    "preference": "Preferences",
    "goal": "Goals and task state",
    "decision": "Decisions",
    "fact": "Facts",
}
SUPERSEDED_TITLE = "No longer current (superseded):"
STYLES: Final = ("full", "titled", "bare")
"""How the state renders, richest first: intro, titles by kind and turn labels; titles only; one line
an item. :func:`render` picks the richest that keeps as many items as the barest does."""
_FLAGS = re.IGNORECASE
_UPDATE = re.compile(
    r"\b(?:actually|instead|change[sd]?|update[sd]?|raise[sd]?|lower(?:ed)?|increase[sd]?|decrease[sd]?|"
    r"move[sd]?|switch(?:ed)?|now|no longer|rather than|anymore|any more|scratch that|correction|"
    r"revise[sd]?|bump(?:ed)?|extend(?:ed)?|push(?:ed)?|make it|new|"
    r"from (?:this|next) (?:week|month|sprint|quarter|release)|from today|starting (?:today|tomorrow|this|next)|"
    r"after all|go(?:es)? (?:up|down)|went (?:up|down))\b",
    _FLAGS,
)
# "Now" in these says when a rule starts or what is true, not that something changed.
_NOT_UPDATE = re.compile(r"\b(?:from now on|for now|right now|just now|as of now|until now)\b", _FLAGS)
_WORD = re.compile(r"[a-z][a-z0-9_.+-]*[a-z0-9+]|[a-z]", _FLAGS)
# Words that say how something is set, not what: they never make two sentences one subject.
_STOP_WORDS = """
a an the and or but if then than that this these those it its it's is are was were be been being
to of in on at by for with from as into onto about over under up down out off so too very just
i we you he she they me us him her them my our your their mine ours yours theirs i'm we're you're
do does did don't doesn't not no never always must should shall will would can could may might
please let let's lets use using used keep make made sure ensure avoid only also all any each every
now going forward actually instead change changed update updated raise raised lower lowered
increase increased decrease decreased move moved switch switched new rather anymore more less
most least max min maximum minimum want like need prefer go what which who whom when where why
how there here have has had get got set say said one two three four five six seven eight nine
ten okay ok yes yeah thanks thank hi hello bump bumped extend extended push pushed that's
"""
_STOP = frozenset(_STOP_WORDS.split())
# Words of one family name the same subject: "use Celsius" changes "use Fahrenheit".
_FAMILIES: Final[Mapping[str, str]] = {
    **dict.fromkeys(("celsius", "fahrenheit", "kelvin", "°c", "°f"), "~temperature-unit"),
    **dict.fromkeys(("metric", "imperial", "si"), "~unit-system"),
    **dict.fromkeys(("terse", "concise", "brief", "verbose", "detailed", "short", "long"), "~answer-length"),
    **dict.fromkeys(("deadline", "due"), "~deadline"),
    **dict.fromkeys(("budget", "cap", "caps", "capped", "spend", "spending", "cost"), "~budget"),
    **dict.fromkeys(("english", "french", "german", "spanish", "japanese", "chinese"), "~language"),
}


@dataclass(frozen=True, slots=True)
class Item:
    """One thing the user set: the sentence as written, its kind, where it came from."""

    kind: Kind
    text: str
    seq: int
    """The turn that said it."""
    n: int
    """The transcript ordinal of the message that said it."""
    superseded_by: int | None = None
    """The turn whose later sentence changed it; None while it holds."""
    model: bool = False
    """Stated by the summarizer's model (a checked summary item, ``summaries.schema``), in its wording,
    not the user's: shown as such, and it never changes an item the user set."""

    @property
    def current(self) -> bool:
        return self.superseded_by is None

    def to_data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Item:
        """An item carried in a stored state (:meth:`to_data`)."""
        return cls(**data)


# An assistant's proposal: "I'll use Postgres 16 for this", "I suggest we cap retries at 3".
_PROPOSAL = re.compile(
    r"\b(?:i|we)(?:'ll| will|'d| would)(?: \w+)? (?:use|go with|switch to|pick|choose|keep|stick with)\b"
    r"|\b(?:i|we) (?:suggest|propose|recommend)\b|\bwe should (?:use|go with|switch to|keep|stick with)\b"
    r"|\blet'?s (?:go with|use|stick with|keep|switch to)\b|\bmy (?:suggestion|recommendation|proposal) is\b",
    _FLAGS,
)
# The user's whole reply accepts it: "ok", "yes, go ahead", "sounds good", "LGTM" (a "but" is no yes).
_ACCEPT = re.compile(
    r"^\W*(?:ok(?:ay)?|yes|yep|yeah|sure|sounds good|agreed|deal|go ahead|do it|let'?s do (?:it|that)|"
    r"perfect|great|lgtm|approved|fine(?: by me)?|that works|go for it|makes sense|please do)\b",
    _FLAGS,
)
_BUT = re.compile(r"\b(?:but|however|instead|rather|except|no|not|don'?t)\b", _FLAGS)
ACCEPT_MAX_WORDS = 12


def accepted(proposal: str, reply: str, seq: int, n: int) -> list[Item]:
    """The decisions an assistant message proposed that the user's ``reply`` accepted, each the
    assistant's sentence verbatim (``seq`` and ``n`` are the assistant message's)."""
    if len(reply.split()) > ACCEPT_MAX_WORDS or not _ACCEPT.search(reply) or _BUT.search(reply):
        return []
    return [
        Item("decision", s, seq, n)
        for s in sentences(proposal)
        if _PROPOSAL.search(s) and not s.rstrip().endswith("?") and len(s) <= MAX_SENTENCE_CHARS
    ]


# A summarizer's quote of a user's sentence, as the prompt asks for it: - [rule] "the sentence"
_QUOTED = re.compile(
    r"^[ \t]*[-*][ \t]*\[(?P<kind>rule|constraint|preference|goal|decision|fact)\][ \t]*"
    r"[\"\u201c]?(?P<text>[^\n]*?)[\"\u201d]?[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)


def quoted(summary: str, said: Sequence[tuple[int, int, str]]) -> tuple[list[Item], str]:
    """The items a summary quotes from the user (``said``: each user message's turn, ordinal and
    text), each kept only when a message holds the sentence word for word (a quote the transcript
    does not support is dropped); and the summary without those lines (the state shows the items)."""
    found: list[Item] = []
    for match in _QUOTED.finditer(summary):
        text = match.group("text").strip()
        if len(text) < 8 or len(text) > MAX_SENTENCE_CHARS:
            continue
        source = next(((seq, n) for seq, n, words in said if text in words), None)
        if source is not None:
            found.append(Item(cast(Kind, match.group("kind").lower()), text, *source))
    rest = "\n".join(line for line in summary.splitlines() if _QUOTED.match(line) is None)
    return found, rest.strip()


def extract(text: str, seq: int, n: int) -> list[Item]:
    """The items one user message states, in order."""
    return [Item(kind, s, seq, n) for s in sentences(text) if (kind := classify(s)) is not None]


@functools.lru_cache(maxsize=8192)  # a state compares each sentence with many: read it once
def subject(text: str) -> frozenset[str]:
    """What a sentence is about: its content words (families merged), without values or how-words."""
    words = set()
    for found in _WORD.findall(VALUE.sub(" ", text.lower())):
        word = found.strip(".-+")
        if len(word) < 3 or word in _STOP:
            continue
        words.add(_FAMILIES.get(word, word.removesuffix("s") if len(word) > 4 else word))
    return frozenset(words)


@functools.lru_cache(maxsize=8192)
def values(text: str) -> frozenset[str]:
    """The values a sentence sets (numbers, amounts, dates, identifiers), lower-cased."""
    return frozenset(v.lower().replace(",", "") for v in VALUE.findall(text))


def changes(later: Item, earlier: Item) -> bool:
    """Whether ``later`` restates ``earlier``'s subject with another value (so ``earlier`` no longer holds).

    The same subject: a family in common ("Celsius" and "Fahrenheit"), or most of the shorter
    sentence's content words, two at least ("the retry limit" does not change "the spending limit").
    """
    if later.seq <= earlier.seq or later.text == earlier.text:
        return False
    a, b = subject(later.text), subject(earlier.text)
    shared = a & b
    families = any(word.startswith("~") for word in shared)
    said_change = _UPDATE.search(_NOT_UPDATE.sub(" ", later.text)) is not None
    other_value = bool(values(later.text)) and values(later.text) != values(earlier.text)
    # "Switch timestamps to America/Sao_Paulo" after "write timestamps in Asia/Kolkata": one word of
    # subject each, the same, another value, and a word of change.
    contained = bool(shared) and 2 * len(shared) >= min(len(a), len(b)) and said_change and other_value
    close = (len(shared) >= 2 and len(shared) >= 0.5 * min(len(a), len(b))) or contained
    if not (families or close):
        return False
    if "fact" in (later.kind, earlier.kind):
        # A fact changes only a fact (one that says so, or the same sentence with another value), or
        # across kinds what says it changes it, with another value: "Actually, make the window 60
        # minutes." after a constraint on it, "customer data has to live in eu-west-3 now" after a fact.
        same = len(shared) >= 0.8 * max(len(a), len(b))
        told = said_change and close and other_value
        return told or (later.kind == earlier.kind and ((said_change and close) or (same and other_value)))
    if said_change:
        return True
    if a - b and b - a:
        # Each names something the other does not ("never log tokens in auth", "... in checkout"):
        # without a word of change, two subjects side by side.
        return False
    # No word of change: another value (or another member of a family) still changes it.
    return other_value or (families and a != b)


def merge(earlier: Iterable[Item], found: Iterable[Item]) -> list[Item]:
    """``earlier`` (a carried state) and ``found`` (read from messages) as one state, in turn order:
    each item once, and every item a later one changes marked superseded."""
    seen: dict[tuple[int, str], Item] = {}
    for item in (*earlier, *found):
        key = (item.n, item.text)
        known = seen.get(key)
        # A carried item keeps the supersession it had; a re-read one adds nothing new.
        if known is None or (known.superseded_by is None and item.superseded_by is not None):
            seen[key] = item
    items = sorted(seen.values(), key=lambda i: (i.seq, i.n))
    # Only a later item sharing a subject word (a family counts as one) can change an item.
    by_word: defaultdict[str, list[int]] = defaultdict(list)
    for position, item in enumerate(items):
        for word in subject(item.text):
            by_word[word].append(position)
    out: list[Item] = []
    for index, item in enumerate(items):
        if not item.current:
            out.append(item)
            continue
        # Only an item with a family or two words in common can change it (``changes``); the first wins.
        shared: Counter[int] = Counter()
        for word in subject(item.text):
            weight = 2 if word.startswith("~") else 1
            for p in by_word[word][bisect.bisect_right(by_word[word], index) :]:
                shared[p] += weight
        # One word in common is enough when it is the whole of a short subject (``changes``: contained).
        least = 1 if len(subject(item.text)) <= 4 else 2
        candidates = sorted(p for p, n in shared.items() if n >= least)
        # The model's wording never changes what the user set (only a later model item may change its own).
        at = next(
            (p for p in candidates if (item.model or not items[p].model) and changes(items[p], item)), None
        )
        if at is None:
            out.append(item)
            continue
        out.append(replace(item, superseded_by=items[at].seq))
        if items[at].kind == "fact" and item.kind != "fact":
            # "Actually, make the window 60 minutes." changes a constraint: it is one, and ranks as one.
            items[at] = replace(items[at], kind=item.kind)
    # A sentence said again is one item, the latest saying of it (a state lists a line once).
    latest = {i.text: i for i in out if i.current}
    return [i for i in out if not i.current or latest[i.text] is i]


@dataclass(frozen=True, slots=True)
class Rendered:
    """The state as a message's text within a budget, and which items it holds."""

    text: str
    kept: tuple[Item, ...]
    dropped: tuple[Item, ...]


def render(
    items: Sequence[Item], budget: int, count: Callable[[str], int], shown: Collection[Item] = ()
) -> Rendered:
    """The state's text within ``budget`` tokens: the most items that fit, by value, in the richest
    style that holds as many (:data:`STYLES`: labels only where they fit).

    ``shown`` are the items whose sentence the history still says (their message is verbatim, or
    the part of it kept when it was cut holds the sentence): the current ones are there already and
    are not repeated. What goes first when space is short: superseded items whose message is gone
    (history now), then by :data:`TIERS` from the last (facts and preferences, then goals and
    decisions, then constraints and rules), within a tier the least value per token first (:func:`value`). A
    superseded item whose message is still verbatim ranks with its kind: without its mark the old
    value reads as current beside the new.
    """
    listed = [i for i in items if not (i.current and i in shown)]
    gone = [i for i in listed if not i.current and i not in shown]
    rest = [i for i in listed if i.current or i in shown]
    by_value = sorted(rest, key=lambda i: (-TIERS[i.kind], value(i) / max(1, count(i.text)), i.seq, i.n))
    ranked = gone + by_value
    best: Rendered | None = None
    for style in STYLES:
        fitted = _fewest_drops(listed, ranked, budget, count, style)
        if fitted is not None and (best is None or len(fitted.kept) > len(best.kept)):
            best = fitted
    return best or Rendered("", (), tuple(listed))


# What names one thing exactly: a ticket, a host, a path, a channel, an address, a date.
_IDENTIFIER = re.compile(
    r"[A-Za-z][\w.-]*[-_./:#@][\w.-]*\d|\d[\w]*[-_./:@][A-Za-z]|(?<![\w#])#\w|\w@\w|(?<!\w)/\w+/|\d+[./-]\d+[./-]\d+"
)


def value(item: Item) -> int:
    """What an item is worth beside others of its tier, before its cost: a preference says how to answer
    and a fact that names something exactly (a ticket, a host, a date) is worth twice a remark with a
    small number ("Version 2 of the client fixed the bug.")."""
    return 2 if item.kind != "fact" or _IDENTIFIER.search(item.text) else 1


def _fewest_drops(
    listed: Sequence[Item], ranked: Sequence[Item], budget: int, count: Callable[[str], int], style: str
) -> Rendered | None:
    """The fewest drops (in ``ranked`` order) whose text in ``style`` fits ``budget``; None if none does."""

    def without(k: int) -> list[Item]:
        dropped = {id(i) for i in ranked[:k]}
        return [i for i in listed if id(i) not in dropped]

    # The text shrinks as drops grow, so bisect.
    low, high = 0, len(ranked)
    if count(_text(without(high), style)) > budget:
        return None
    while low < high:
        mid = (low + high) // 2
        if count(_text(without(mid), style)) <= budget:
            high = mid
        else:
            low = mid + 1
    kept = without(low)
    if not kept:
        return None
    return Rendered(_text(kept, style), tuple(kept), tuple(ranked[:low]))


_MODEL: Final = ", the summary's wording"


def _text(items: Sequence[Item], style: str = "full") -> str:
    if not items:
        return ""
    full, titled = style == "full", style in ("full", "titled")
    sections = [STANDING_HEADER, INTRO] if full else [STANDING_HEADER]
    for kind in KINDS:
        lines = [
            (f"- [turn {i.seq}{_MODEL if i.model else ''}] {i.text}" if full else f"- {i.text}")
            for i in items
            if i.kind == kind and i.current
        ]
        if lines:
            sections.append(f"{_TITLES[kind]}:\n" + "\n".join(lines) if titled else "\n".join(lines))
    old = [
        f"- [turn {i.seq}, changed at turn {i.superseded_by}] {i.text}" if full else f"- {i.text}"
        for i in items
        if not i.current
    ]
    if old:
        sections.append(f"{SUPERSEDED_TITLE}\n" + "\n".join(old))
    return ("\n\n" if titled else "\n").join(sections)
