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
from typing import Any, Final, Literal, cast

Kind = Literal["rule", "constraint", "preference", "goal", "decision", "fact"]

KINDS: Final[tuple[Kind, ...]] = ("rule", "constraint", "preference", "goal", "decision", "fact")
"""Every kind, in the order the state shows them."""
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
ITEM_MAX_WORDS = 30
"""A longer sentence is prose that mentions things (a budget, a deadline, a name), not an item to keep word
for word: the rules, limits and facts people set are said in a few words."""
MAX_SENTENCE_CHARS = 400
"""A longer sentence is prose or pasted content, not a stated rule: it is not an item."""

_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_FLAGS = re.IGNORECASE

_DECISION = re.compile(
    r"\b(?:we|i)(?:'ve| have)? (?:decided|agreed|settled on|chose|picked|opted)\b"
    r"|\blet'?s (?:go with|use|stick with|keep|set|ramp|raise|lower|cap|limit|target|aim|switch|move|settle|"
    r"standardi[sz]e)\b"
    r"|\b(?:we(?:'re| are)|i(?:'m| am)) going with\b|\bwe(?:'ll| will) (?:use|go with|stick with)\b"
    r"|\bthe decision is\b|\bdecided:",
    _FLAGS,
)
_RULE = re.compile(
    r"\bneeds? (?:a |an |your |my |our |two |2 )?(?:second pair of eyes|approval|sign-?off|review)|\bstays? (?:out of|away from)\b|"
    r"\b(?:never|always|must|mustn'?t|shall(?: not)?|do not|don'?t|under no circumstances|make sure|"
    r"ensure|avoid|from now on|going forward|be sure to|is (?:forbidden|not allowed|prohibited)|"
    r"you (?:should|may) not|no \w+(?: \w+)? without|not allowed|forbidden|prohibited|(?:safety |hard )?rule:)",
    _FLAGS,
)
# A rule is said as one: an imperative ("Never ...", "Do not ..."), a label ("Safety rule: ..."), a person
# or the agent as its subject ("you must", "we never"), or a prohibition. "The exporter never had load
# tests." and "It must have been copied" describe, they rule nothing.
_DIRECTIVE = re.compile(
    r"^(?:[\w ,'-]{0,30}:\s*)?(?:and |also |so |please |from now on,? |going forward,? |if [^,]+, )?"
    r"(?:never|always|do not|don'?t|must|make sure|ensure|avoid|be sure|under no circumstances|no \w+)\b"
    r"|\b(?:you|we|i|anyone|everyone|nobody|no one|the agent|agents)\b(?: \w+){0,2} "
    r"(?:must|mustn'?t|should|shall|never|always|may not|cannot|can'?t|are not|aren'?t)\b"
    r"|\b(?:forbidden|not allowed|prohibited|rule:|from now on|going forward)|\bno \w+(?: \w+)? without\b"
    r"|\bneeds? (?:a |an |your |my |our |two |2 )?(?:second pair of eyes|approval|sign-?off|review)"
    r"|\bstays? (?:out of|away from)\b",
    _FLAGS,
)
# "About the CI pipeline: ..." — a topic label counts no words of the sentence it introduces.
_LABELLED = re.compile(r"^[^:]{1,40}:\s+")
_CONDITION = re.compile(r"^(?:if|when|whenever|once|should) [^,;]{3,80}[,;]\s*(?:then\s+)?", _FLAGS)
_EPISTEMIC = re.compile(r"\bmust(?:n'?t)? (?:have|be \w+ing)\b", _FLAGS)
# An instruction that holds beyond one turn: "Get Priya's sign-off before any change to the schema."
_STANDING_ORDER = re.compile(
    r"\b(?:before|after|whenever|every time|each time) (?:any|every|each|you|we)\b|\b(?:any|every) time\b",
    _FLAGS,
)
_CONSTRAINT = re.compile(
    rf"\b(?:at most|at least|no more than|no less than|not more than|up to|maximum|minimum|max|min|constraints?|"
    rf"limit(?:ed|s)?|caps?|capped|budget|deadline|due|within|required?|requirements?|"
    # "only" limits when it opens the sentence, follows what it limits ("3.11 only", "admins only,")
    # or restricts an action or a place; "the TTL is only a backstop" limits nothing.
    rf"(?<=^)only|(?<=\w )only(?=[,.;:!]|$)|only (?:use|run|deploy|allow|accept|ship|merge|read|write|"
    rf"touch|on|in|from|between|during|if|when|with|after|before|for|via|through|by|within|up to|\d)|"
    rf"compatible with|exceed|must be|has to be|needs to be|has to|have to|by (?:{_WEEKDAYS}|tomorrow|tonight|end of|the \d+|"
    rf"{_MONTHS}|\d)|(?:under|over|below|above|beyond|less than|more than|fewer than) \$?\d[\d,.]*|"
    rf"(?:can'?t|cannot|must not|may not|mustn'?t) (?:go|be|get|run|exceed|take|spend|use) (?:over|above|beyond|past|more|longer))\b",
    _FLAGS,
)
_PREFERENCE = re.compile(
    r"\b(?:prefer(?:red|s)?|preference|i'?d rather|i like|i want (?:answers|responses|replies|it|them|you)|"
    r"please (?:use|keep|write|answer|reply|respond|give|show|format|stick)|"
    r"(?:metric|imperial|celsius|fahrenheit|kelvin)|short answers?|"
    r"(?:be|keep (?:it|them|answers|replies|responses)|answers?|responses?|replies)(?: \w+)? "
    r"(?:terse|concise|brief|verbose|short|detailed)|"
    r"bullet points?|in (?:english|french|german|spanish|japanese|chinese))\b",
    _FLAGS,
)
# How things are to be written or named, for good: "Write dates like 21.07.2025", "Call the queue puffin".
_HOW_TO_WRITE = re.compile(
    r"^(?:please\s+)?(?:use|write|format|spell|call|name|address|refer to|put|list|sign|label)\b.{0,60}?"
    r"\b(?:dates?|times?|timestamps?|numbers?|amounts?|names?|units?|currenc(?:y|ies)|reviewers?|"
    r"the way|like|as)\b",
    _FLAGS,
)
# An instruction scoped to everything from now: "In anything you write for me, call the queue puffin."
_SCOPED = re.compile(
    r"^(?:in|for|with|on|across) (?:anything|everything|all|every|each|any)\b[^,]{0,60},", _FLAGS
)
_LABEL = re.compile(
    r"^\W*(?:(?:today'?s |the |your )?(?:task|job|assignment|mission)|status|update|progress|current goal|goal|"
    r"next step)\s*:",
    _FLAGS,
)
# "Timestamps in UTC, please.": how something is to be, asked politely, with no verb of a request.
_POLITE = re.compile(r",\s*please\W*$", _FLAGS)
_GOAL = re.compile(
    r"\b(?:goal|objective|aim is|we(?:'re| are) (?:trying|working|migrating|building|moving|planning|aiming)|"
    r"i(?:'m| am) (?:trying|working|migrating|building|moving|planning|aiming)|i want to|we want to|"
    r"we need to|i need to|the task is|the plan is|our plan|the point is|target is|milestone|"
    r"next step|todo|to-do|we(?:'re| are) (?:done|finished) (?:with|when)|done when|what'?s left|"
    r"left to do|still to do|remaining work|(?:is|are) next|is (?:deployed|live|shipped|merged|released)|"
    r"is (?:done|finished|complete))\b|\b(?:task|status|update|progress|current goal|job|assignment|mission):",
    _FLAGS,
)
# A fact: a declarative sentence that carries something specific (a number, a name, an address).
_SPECIFIC = re.compile(r"\d|@|https?://|#\w|(?<!\w)/\w|\w[._:=/]\w|\b(?:called|named|known as)\b", _FLAGS)
# A name mid-sentence ("the office in Porto", "ask Priya"): a capital word, not a short acronym (TTL, API).
_MID_CAPITAL = re.compile(r"(?<=[a-z,;:] )(?:[A-Z][a-z][\w-]*|[A-Z][A-Z0-9_-]{4,}|[A-Z]+[\d_-][\w-]*)")
# A request is not a fact: "look at part 3", "can you run it", "please check the logs".
_REQUEST = re.compile(
    r"^(?:please|pls|can|could|would|will|let'?s|look|check|read|run|fix|open|show|try|go|add|remove|"
    r"delete|update|see|tell|give|find|write|explain|continue|proceed|do|make|get|put|set|start|stop|"
    r"now|ok|okay|thanks|thank)\b|\bplease\b",
    _FLAGS,
)
_CHANGE_TO = re.compile(
    r"^(?:\w+,\s*)?(?:please\s+)?(?:switch|change|move|set|make|raise|lower|bump|push|increase|decrease|"
    r"reduce|extend)\b.{0,60}?\b(?:to|at)\b",
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
    r"revise[sd]?|bump(?:ed)?|extend(?:ed)?|push(?:ed)?|make it|new|"
    r"from (?:this|next) (?:week|month|sprint|quarter|release)|from today|starting (?:today|tomorrow|this|next)|"
    r"after all|go(?:es)? (?:up|down)|went (?:up|down))\b",
    _FLAGS,
)
# "Now" in these says when a rule starts or what is true, not that something changed.
_NOT_UPDATE = re.compile(r"\b(?:from now on|for now|right now|just now|as of now|until now)\b", _FLAGS)
_VALUE = re.compile(
    # An identifier with a digit is one value: "eu-central-1", "db-38.internal", "v7.34.4".
    r"\b[a-z][a-z0-9]*(?:[-._][a-z0-9]+)*?[-._]?\d[a-z0-9]*(?:[-._][a-z0-9]+)*\b|"
    rf"[$€£]?\d[\d,.:/]*(?:\s?(?:%|k|m|gb|mb|kb|ms|s|h|usd|eur|dollars?|euros?))?\b|\b(?:{_WEEKDAYS}|{_MONTHS})\b"
    # A time zone is a value too: "Asia/Kolkata" then "America/Sao_Paulo".
    r"|\b[A-Z][a-z]+/[A-Z][A-Za-z_]+\b",
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
    if len(_LABELLED.sub("", sentence).split()) > ITEM_MAX_WORDS:
        return None
    if _DECISION.search(sentence):
        return "decision"
    rule = _RULE.search(sentence) is not None and _DIRECTIVE.search(sentence) is not None
    # An instruction that holds beyond the turn: "Get X's sign-off before any change", "If the error
    # rate spikes, flip the freeze flag".
    order = _IMPERATIVE.search(sentence) is not None and _STANDING_ORDER.search(sentence) is not None
    condition = _CONDITION.match(sentence)
    order = order or (condition is not None and _IMPERATIVE.search(sentence[condition.end() :]) is not None)
    rule = (rule and not _EPISTEMIC.search(sentence)) or order
    constraint = _CONSTRAINT.search(sentence) is not None
    if constraint and (_VALUE.search(sentence) or not rule):
        return "constraint"
    if rule:
        return "rule"
    polite = _POLITE.search(sentence) is not None and not _IMPERATIVE.search(sentence)
    if _PREFERENCE.search(sentence) or polite or _HOW_TO_WRITE.search(sentence) or _SCOPED.search(sentence):
        return "preference"
    if _GOAL.search(sentence) and (not _REQUEST.match(sentence) or _LABEL.match(sentence)):
        return "goal"
    if _CHANGE_TO.search(sentence) and _VALUE.search(sentence):
        # "Switch timestamps to America/Sao_Paulo, please.": a request that sets a value is a fact
        # of the state, re-kinded by the item it changes (``merge``).
        return "fact"
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


# What marks a sentence as carrying something a later turn may need by name: a number, an address, a
# path, an identifier's inner punctuation or capital, a quoted or code term.
_NAMED = re.compile(r"\d|@|https?://|/\w|\w[._:=]\w|[a-z][A-Z]|[`\"'“”]")
_ASK = re.compile(
    r"\b(?:please|pls|can you|could you|would you|will you|i need you to|i want you to|help me|"
    r"your (?:task|job|goal) is|you (?:need|have) to|you should|make sure|we need to|i need to|"
    r"i want to|we want to|let'?s)\b",
    _FLAGS,
)
_IMPERATIVE = re.compile(
    r"^(?:please\s+)?(?:add|ask|build|call|cc|change|check|clean|close|compare|continue|create|debug|delete|"
    r"deploy|disable|enable|escalate|explain|file|find|fix|flip|get|go|implement|investigate|keep|look|"
    r"loop|make|migrate|move|notify|open|page|paste|ping|port|post|proceed|put|read|refactor|remove|"
    r"rename|rerun|respond|review|rewrite|roll|route|run|send|set|ship|show|solve|start|stop|"
    r"summari[sz]e|switch|tag|tell|test|try|turn|update|upgrade|use|verify|wait|write)\b",
    _FLAGS,
)
_ACK = re.compile(
    r"^\W*(?:acknowledged|understood|noted|got it|ok(?:ay)?|sure|will do|on it|thanks|thank you|"
    r"sounds good|roger|copy that|done|great|perfect|continuing|proceeding|moving on)\b",
    _FLAGS,
)
ACK_MAX_WORDS = 12


def asks(sentence: str) -> bool:
    """Whether a sentence asks for something: a question, a request, an imperative."""
    s = sentence.strip()
    return s.endswith("?") or _ASK.search(s) is not None or _IMPERATIVE.search(s) is not None


def asks_for_work(text: str) -> bool:
    """Whether a message asks for work (a question, a request, an instruction, a goal): a remark such
    as "The webhook retries three times before dead-lettering." does not, and is no task."""
    return bool(asking(text))


def asking(text: str) -> list[str]:
    """The sentences of a message that ask for work: its statement of the task, without its remarks."""
    return [s for s in sentences(text) if asks(s) or _GOAL.search(s) is not None]


def is_filler(sentence: str) -> bool:
    """Whether a sentence states nothing a later turn needs: no item of the state, no request or
    question, and nothing named (no number, identifier, path or quoted term). An acknowledgment
    ("Acknowledged. Continuing with the plan.") is filler too."""
    s = sentence.strip()
    if not s or (_ACK.search(s) and len(s.split()) <= ACK_MAX_WORDS):
        return True
    return classify(s) is None and not asks(s) and _NAMED.search(s) is None and not _MID_CAPITAL.search(s)


def says_nothing_new(text: str, *, items: bool = False) -> bool:
    """Whether a message's every sentence is filler, or with ``items`` an item of the state (which keeps
    it word for word): keeping the message verbatim would repeat or add nothing."""
    if "```" in text:
        return False  # code (a command, a patch, a flag) is never filler
    found = sentences(text)
    return bool(found) and all(is_filler(s) or (items and classify(s) is not None) for s in found)


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
def values(text: str) -> frozenset[str]:
    """The values a sentence sets (numbers, amounts, dates, identifiers), lower-cased."""
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
        at = next((p for p in candidates if changes(items[p], item)), None)
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


def _text(items: Sequence[Item], style: str = "full") -> str:
    if not items:
        return ""
    full, titled = style == "full", style in ("full", "titled")
    sections = [STANDING_HEADER, INTRO] if full else [STANDING_HEADER]
    for kind in KINDS:
        lines = [
            f"- [turn {i.seq}] {i.text}" if full else f"- {i.text}"
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
