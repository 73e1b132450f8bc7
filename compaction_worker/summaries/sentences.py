"""What a sentence of the user's says: its kind (a rule, a constraint, a preference, a goal, a decision,
a fact, or nothing to keep), whether it asks for work, whether it is filler.

Read without a model (it must hold during an outage too), from the words people use to set
things: a directive, a limit, a label, a value. The standing state (:mod:`.standing`) keeps what
these sentences set; the pipeline gives filler no room (``strategies/allocation.py``).
"""

from __future__ import annotations

import re
from typing import Final, Literal

Kind = Literal["rule", "constraint", "preference", "goal", "decision", "fact"]

KINDS: Final[tuple[Kind, ...]] = ("rule", "constraint", "preference", "goal", "decision", "fact")
"""Every kind, in the order the state shows them."""
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
VALUE = re.compile(
    # An identifier with a digit is one value: "eu-central-1", "db-38.internal", "v7.34.4".
    r"\b[a-z][a-z0-9]*(?:[-._][a-z0-9]+)*?[-._]?\d[a-z0-9]*(?:[-._][a-z0-9]+)*\b|"
    rf"[$€£]?\d[\d,.:/]*(?:\s?(?:%|k|m|gb|mb|kb|ms|s|h|usd|eur|dollars?|euros?))?\b|\b(?:{_WEEKDAYS}|{_MONTHS})\b"
    # A time zone is a value too: "Asia/Kolkata" then "America/Sao_Paulo".
    r"|\b[A-Z][a-z]+/[A-Z][A-Za-z_]+\b",
    _FLAGS,
)


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
    if constraint and (VALUE.search(sentence) or not rule):
        return "constraint"
    if rule:
        return "rule"
    polite = _POLITE.search(sentence) is not None and not _IMPERATIVE.search(sentence)
    if _PREFERENCE.search(sentence) or polite or _HOW_TO_WRITE.search(sentence) or _SCOPED.search(sentence):
        return "preference"
    if _GOAL.search(sentence) and (not _REQUEST.match(sentence) or _LABEL.match(sentence)):
        return "goal"
    if _CHANGE_TO.search(sentence) and VALUE.search(sentence):
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
