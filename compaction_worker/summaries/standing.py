"""The conversation's standing state: the rules, constraints, preferences, goals, decisions and facts
the user stated, read from the user's own words, verbatim, each at its current value.

A summary paraphrases and a later summary paraphrases the paraphrase: a rule the user set at
turn 3 is a clause by the second compaction and gone by the third. So what the user *set* is
read deterministically (no LLM: it must hold during an outage too) from every user message,
kept as the sentence the user wrote with its kind and turn, carried from compaction to
compaction as data, and rendered in the summary turn under ``STANDING_HEADER``.

Update-aware: a later sentence about the same subject ("raise the cap to 800" after "keep the
cap at 500") makes the earlier one superseded; superseded items are shown apart, as no longer
current, and are the first to go when space is short. Then facts, decisions, goals,
preferences; constraints and rules go last (docs/design.md, "The standing state").
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final, Literal, cast

Kind = Literal["rule", "constraint", "preference", "goal", "decision", "fact"]

KINDS: Final[tuple[Kind, ...]] = ("rule", "constraint", "preference", "goal", "decision", "fact")
"""Every kind, in the order the state shows them and keeps them when space is short (facts go first)."""

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
MAX_SENTENCE_CHARS = 400
"""A longer sentence is prose or pasted content, not a stated rule: it is not an item."""

_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_FLAGS = re.IGNORECASE

_DECISION = re.compile(
    r"\b(?:we|i)(?:'ve| have)? (?:decided|agreed|settled on|chose|picked|opted)\b|\blet'?s (?:go with|use|stick with)\b"
    r"|\b(?:we(?:'re| are)|i(?:'m| am)) going with\b|\bwe(?:'ll| will) (?:use|go with|stick with)\b"
    r"|\bthe decision is\b|\bdecided:",
    _FLAGS,
)
_RULE = re.compile(
    r"\b(?:never|always|must|mustn'?t|shall(?: not)?|do not|don'?t|under no circumstances|make sure|"
    r"ensure|avoid|from now on|going forward|be sure to|is (?:forbidden|not allowed|prohibited)|"
    r"you (?:should|may) not|no \w+(?: \w+)? without|not allowed|forbidden|prohibited)\b",
    _FLAGS,
)
_CONSTRAINT = re.compile(
    rf"\b(?:at most|at least|no more than|no less than|not more than|up to|maximum|minimum|max|min|"
    rf"limit(?:ed|s)?|caps?|capped|budget|deadline|due|within|only|required?|requirements?|"
    rf"compatible|exceed|must be|has to be|needs to be|by (?:{_WEEKDAYS}|tomorrow|tonight|end of|the \d+|"
    rf"{_MONTHS}|\d))\b",
    _FLAGS,
)
_PREFERENCE = re.compile(
    r"\b(?:prefer(?:red|s)?|preference|i'?d rather|i like|i want (?:answers|responses|replies|it|them|you)|"
    r"please (?:use|keep|write|answer|reply|respond|give|show|format|stick)|"
    r"(?:metric|imperial|celsius|fahrenheit|kelvin)|terse|concise|brief|verbose|short answers?|"
    r"bullet points?|in (?:english|french|german|spanish|japanese|chinese))\b",
    _FLAGS,
)
_GOAL = re.compile(
    r"\b(?:goal|objective|aim is|we(?:'re| are) (?:trying|working|migrating|building|moving|planning|aiming)|"
    r"i(?:'m| am) (?:trying|working|migrating|building|moving|planning|aiming)|i want to|we want to|"
    r"we need to|i need to|the task is|the plan is|our plan|the point is|target is|task:|milestone|"
    r"next step|todo|to-do|status:|we(?:'re| are) (?:done|finished) with|is (?:done|finished|complete))\b",
    _FLAGS,
)
# A fact: a declarative sentence that carries something specific (a number, a name, an address).
_SPECIFIC = re.compile(r"\d|@|https?://|\b(?:called|named|known as)\b", _FLAGS)
_MID_CAPITAL = re.compile(r"(?<=[a-z,;:] )[A-Z][\w-]+")
# A request is not a fact: "look at part 3", "can you run it", "please check the logs".
_REQUEST = re.compile(
    r"^(?:please|pls|can|could|would|will|let'?s|look|check|read|run|fix|open|show|try|go|add|remove|"
    r"delete|update|see|tell|give|find|write|explain|continue|proceed|do|make|get|put|set|start|stop|"
    r"now|ok|okay|thanks|thank)\b|\bplease\b",
    _FLAGS,
)
# What happened once is an observation, not a standing fact: "it failed twice this morning".
_TRANSIENT = re.compile(
    r"\b(?:this morning|this afternoon|tonight|yesterday|last time|just now|earlier today|right now|"
    r"a minute ago|twice|again|so far|at the moment|currently)\b",
    _FLAGS,
)
_UPDATE = re.compile(
    r"\b(?:actually|instead|change[sd]?|update[sd]?|raise[sd]?|lower(?:ed)?|increase[sd]?|decrease[sd]?|"
    r"move[sd]?|switch(?:ed)?|now|no longer|rather than|anymore|any more|scratch that|correction|"
    r"revise[sd]?|bump(?:ed)?|extend(?:ed)?|push(?:ed)?|make it|new)\b",
    _FLAGS,
)
# "Now" in these says when a rule starts or what is true, not that something changed.
_NOT_UPDATE = re.compile(r"\b(?:from now on|for now|right now|just now|as of now|until now)\b", _FLAGS)
_VALUE = re.compile(
    rf"[$€£]?\d[\d,.:/]*(?:\s?(?:%|k|m|gb|mb|kb|ms|s|h|usd|eur|dollars?|euros?))?\b|\b(?:{_WEEKDAYS}|{_MONTHS})\b",
    _FLAGS,
)
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

    @property
    def current(self) -> bool:
        return self.superseded_by is None

    def to_data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Item:
        """An item carried in a stored state (:meth:`to_data`)."""
        return cls(**data)


def sentences(text: str) -> list[str]:
    """The sentences of a message's prose: code blocks, quoted lines and tables left out."""
    prose = re.sub(r"```.*?(?:```|\Z)", "\n", text, flags=re.DOTALL)
    out: list[str] = []
    for raw in prose.splitlines():
        line = raw.strip().lstrip("-*•>#").strip()
        if not line or line.startswith("|"):
            continue
        out += [s.strip() for s in re.split(r"(?<=[.!?;])\s+(?=[A-Z0-9\"'(])", line) if s.strip()]
    return out


def classify(sentence: str) -> Kind | None:  # noqa: PLR0911  # one return per kind, in precedence order
    """The kind of item ``sentence`` states, or None when it states none (a question, chatter)."""
    if len(sentence) > MAX_SENTENCE_CHARS or len(sentence) < 8 or sentence.rstrip().endswith("?"):
        return None
    if _DECISION.search(sentence):
        return "decision"
    rule = _RULE.search(sentence) is not None
    constraint = _CONSTRAINT.search(sentence) is not None
    if constraint and (_VALUE.search(sentence) or not rule):
        return "constraint"
    if rule:
        return "rule"
    if _PREFERENCE.search(sentence):
        return "preference"
    if _GOAL.search(sentence):
        return "goal"
    if _REQUEST.search(sentence) or _TRANSIENT.search(sentence):
        return None
    if _SPECIFIC.search(sentence) or _MID_CAPITAL.search(sentence):
        return "fact"
    return None


_PLAIN_WORD = re.compile(r"^[\"'(]?[A-Za-z][a-z'-]*[.,;:!?)\"']*$")
PROSE_SHARE = 0.8
"""The share of plain words that makes a line prose rather than output ("Requirement already
satisfied: pytz in /opt/env/site-packages (2024.1)" is not a requirement anyone set)."""


def is_prose(sentence: str) -> bool:
    """Whether a sentence reads as written words: most of it plain words, few paths, numbers or code."""
    words = sentence.split()
    return bool(words) and sum(1 for w in words if _PLAIN_WORD.match(w)) >= PROSE_SHARE * len(words)


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
    for found in _WORD.findall(_VALUE.sub(" ", text.lower())):
        word = found.strip(".-+")
        if len(word) < 3 or word in _STOP:
            continue
        words.add(_FAMILIES.get(word, word.removesuffix("s") if len(word) > 4 else word))
    return frozenset(words)


@functools.lru_cache(maxsize=8192)
def _values(text: str) -> frozenset[str]:
    return frozenset(v.lower().replace(",", "") for v in _VALUE.findall(text))


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
    close = len(shared) >= 2 and len(shared) >= 0.5 * min(len(a), len(b))
    if not (families or close):
        return False
    said_change = _UPDATE.search(_NOT_UPDATE.sub(" ", later.text)) is not None
    other_value = bool(_values(later.text)) and _values(later.text) != _values(earlier.text)
    if "fact" in (later.kind, earlier.kind):
        # A fact changes only a fact: one that says so, or the same sentence with another value.
        same = len(shared) >= 0.8 * max(len(a), len(b))
        return later.kind == earlier.kind and ((said_change and close) or (same and other_value))
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
        candidates = sorted(p for p, n in shared.items() if n >= 2)
        later = next((items[p] for p in candidates if changes(items[p], item)), None)
        out.append(item if later is None else replace(item, superseded_by=later.seq))
    return out


@dataclass(frozen=True, slots=True)
class Rendered:
    """The state as a message's text within a budget, and which items it holds."""

    text: str
    kept: tuple[Item, ...]
    dropped: tuple[Item, ...]


def render(
    items: Sequence[Item], budget: int, count: Callable[[str], int], shown: Collection[Item] = ()
) -> Rendered:
    """The state's text within ``budget`` tokens.

    ``shown`` are the items whose sentence the history still says (their message is verbatim, or
    the part of it kept when it was cut holds the sentence): the current ones are
    there already and are not repeated. What goes first when space is short: superseded items whose
    message is gone (history now), then facts, decisions, goals, preferences, constraints, rules
    (``KINDS`` from the end), the oldest of a kind first. A superseded item whose message is
    still verbatim ranks with its kind: without its mark the old value reads as current beside the new.
    """
    listed = [i for i in items if not (i.current and i in shown)]
    gone = [i for i in listed if not i.current and i not in shown]
    rest = [i for i in listed if i.current or i in shown]
    ranked = gone + [i for kind in reversed(KINDS) for i in rest if i.kind == kind]

    def without(k: int) -> list[Item]:
        dropped = {id(i) for i in ranked[:k]}
        return [i for i in listed if id(i) not in dropped]

    # The fewest drops (in rank order) that fit: the text shrinks as drops grow, so bisect.
    low, high = 0, len(ranked)
    if count(_text(without(high))) > budget:
        return Rendered("", (), tuple(listed))
    while low < high:
        mid = (low + high) // 2
        if count(_text(without(mid))) <= budget:
            high = mid
        else:
            low = mid + 1
    kept = without(low)
    return Rendered(_text(kept), tuple(kept), tuple(ranked[:low]))


def _text(items: Sequence[Item]) -> str:
    if not items:
        return ""
    sections = [STANDING_HEADER, INTRO]
    for kind in KINDS:
        lines = [f"- [turn {i.seq}] {i.text}" for i in items if i.kind == kind and i.current]
        if lines:
            sections.append(f"{_TITLES[kind]}:\n" + "\n".join(lines))
    old = [f"- [turn {i.seq}, changed at turn {i.superseded_by}] {i.text}" for i in items if not i.current]
    if old:
        sections.append(f"{SUPERSEDED_TITLE}\n" + "\n".join(old))
    return "\n\n".join(sections)
