"""What the demo agent understands: a few requests in English and French, read into a
``Request`` without any model.

=====================  ==========================================================================
request                examples
=====================  ==========================================================================
``remind``             ``remind me in 2 minutes to stretch``, ``remind me to stretch at 5pm``,
                       ``rappelle-moi dans 2 minutes de m'étirer``
``schedule``           ``every weekday at 9am say standup``, ``tomorrow at 9am say hello``,
                       ``say standup every Monday at 10am``,
                       ``tous les jours de semaine à 9h dis standup``
``watch``              ``watch https://example.com every 30 seconds and tell me when it
                       changes``, ``surveille https://example.com toutes les 30 secondes``
``fetch``              ``fetch https://example.com in the background``,
                       ``récupère https://example.com en arrière-plan``
``remember``           ``remember that I like dark roast``, ``souviens-toi que j'aime le café``
``recall_memory``      ``what do you remember about me``, ``que sais-tu de moi``
``list``               ``what's scheduled``, ``qu'est-ce qui est prévu``
``cancel``             ``cancel rc_4f2a9c0d1b7e``, ``annule bg-a1b2c3d4``
``help``               ``help``, ``aide``
=====================  ==========================================================================

Times are the scheduling primitives' own: where a request holds a time (``in 2 minutes``,
``every weekday at 9am``, ``demain à 9h``), the node's parser
(:func:`turnstile.actors.scheduling.timeexpr.parse_when`) finds where it starts and ends, and
the text goes to the tool's time argument as it was written, as a model would pass it; so
whatever the scheduling tools understand, the demo understands, and what they refuse comes back
with their reason. Matching ignores case and accents; what is quoted back keeps them.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from typing import Literal

import msgspec

from turnstile.actors.scheduling.timeexpr import parse_when
from turnstile.runtime.errors import InvalidArgument

__all__ = [
    "MAX_REQUEST_CHARS",
    "Request",
    "Kind",
    "Lang",
    "read_request",
    "time_kind",
    "interval_seconds",
]

#: Longer text is no request (the requests are a line; the parser takes 200 characters of
#: time): reading it would ask the parser once per word, on the session's turn.
MAX_REQUEST_CHARS = 500

Kind = Literal[
    "remind",
    "schedule",
    "watch",
    "fetch",
    "remember",
    "recall_memory",
    "list",
    "cancel",
    "help",
]
Lang = Literal["en", "fr"]


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """A request the demo agent understood.

    Attributes:
        kind: what to do (the module docstring's table).
        lang: the language it was asked in; the answer follows it.
        when: the time as written (``remind``, ``schedule``), for the tool's time argument.
        repeats: ``schedule``: the time repeats (``schedule_cron``), else it is one instant.
        what: the reminder, the message to say, or the fact to remember.
        url: ``watch``, ``fetch``: the URL as written.
        every: ``watch``: the interval as written (``30 seconds``), empty for the default.
        target: ``cancel``: the id.
    """

    kind: Kind
    lang: Lang = "en"
    when: str = ""
    repeats: bool = False
    what: str = ""
    url: str = ""
    every: str = ""
    target: str = ""


#: Any instant: only whether a text is a time, and of which kind, is asked of the parser here;
#: the tool parses it again against the node's clock.
_SOME_INSTANT = datetime(2026, 1, 1, tzinfo=UTC)
#: ``parse_when``'s messages for text that is not a time at all (as opposed to a time it
#: understood and refuses: in the past, too frequent, ambiguous...).
_NOT_A_TIME = ("could not understand", "time expression is")
_REPEATING = re.compile(
    r"^(?:every|each|daily|hourly|weekly|monthly|tous|toutes|chaque|en semaine|du \w+ au)\b"
    r"|^[\d*@]"
)


def time_kind(text: str) -> Literal["once", "cron"] | None:
    """Whether the scheduling parser reads ``text`` as a time: ``"once"``, ``"cron"`` (it
    repeats), or None (not a time at all). A time it understands but refuses (``every 7
    minutes``, a past date) still counts, so that the tool can say why."""
    reading = _reading(text)
    return None if reading is None else reading[0]


def _reading(text: str) -> tuple[Literal["once", "cron"], bool] | None:
    """``(kind, usable)`` as in :func:`time_kind`; ``usable`` is False for a time the parser
    understands but refuses."""
    text = text.strip()
    if not text:
        return None
    try:
        return parse_when(text, now=_SOME_INSTANT).kind, True
    except InvalidArgument as exc:
        if str(exc).startswith(_NOT_A_TIME):
            return None
        return ("cron" if _REPEATING.search(_fold(text)) else "once"), False


def interval_seconds(text: str) -> float | None:
    """``30 seconds``, ``2 minutes``, ``minute``, ``30 secondes`` as seconds, read by the
    scheduling parser as a delay; None when it is not one."""
    text = " ".join(text.split())
    for candidate in (f"in {text}", f"in 1 {text}"):
        try:
            when = parse_when(candidate, now=_SOME_INSTANT)
        except InvalidArgument:
            continue
        if when.kind == "once" and when.run_at is not None:
            return (when.run_at - _SOME_INSTANT).total_seconds()
    return None


def _fold(text: str) -> str:
    """Lower case without accents, one character for one (so a match's offsets are the
    original's too), curly apostrophes straight."""
    out = []
    for c in text:
        base = unicodedata.normalize("NFKD", c)[0].lower()
        out.append("'" if base in "’‘" else base[0])
    return "".join(out)


_URL = r"(?P<url>\S+)"
_PHRASES: list[tuple[Kind, Lang, str]] = [
    ("help", "en", r"(?:help|\?|what can you do\??)"),
    ("help", "fr", r"(?:aide|que sais-tu faire\s*\??)"),
    ("remind", "en", r"(?:please\s+)?remind me\s+(?P<rest>.+)"),
    ("remind", "fr", r"(?:rappelle|rappelez)[- ]moi\s+(?P<rest>.+)"),
    (
        "watch",
        "en",
        rf"watch\s+{_URL}(?:\s+(?:every|each)\s+(?P<every>.+?))?"
        r"(?:\s*,?\s*(?:and\s+)?(?:tell|let) me (?:know )?(?:when|if) it changes)?",
    ),
    (
        "watch",
        "fr",
        rf"surveille[rz]?\s+{_URL}(?:\s+(?:toutes les|tous les|chaque)\s+(?P<every>.+?))?"
        r"(?:\s*,?\s*(?:et\s+)?(?:dis|previens|previens)-moi (?:quand|si) (?:ca|elle|il)"
        r" change)?",
    ),
    ("fetch", "en", rf"(?:fetch|get)\s+{_URL}\s+in the background"),
    ("fetch", "fr", rf"(?:recupere|telecharge)\s+{_URL}\s+en arriere[- ]plan"),
    ("remember", "en", r"(?:please\s+)?remember(?:\s+that\s+|\s*:\s*)(?P<what>.+)"),
    (
        "remember",
        "fr",
        r"(?:souviens|rappelle)[- ]toi(?:\s+que\s+|\s+qu'|\s*:\s*)(?P<what>.+)"
        r"|(?:retiens|note)(?:\s+que\s+|\s+qu'|\s*:\s*)(?P<what2>.+)",
    ),
    (
        "recall_memory",
        "en",
        r"what do you (?:remember|know) about me\s*\??|what do you remember\s*\??",
    ),
    (
        "recall_memory",
        "fr",
        r"que sais-tu (?:de|sur) moi\s*\??|qu'est-ce que tu sais (?:de|sur) moi\s*\??"
        r"|de quoi te souviens-tu\s*\??",
    ),
    (
        "list",
        "en",
        r"(?:what'?s|what is|what are) (?:scheduled|planned|pending|my schedule)\s*\??"
        r"|(?:list|show)(?: me)?(?: my| the)? (?:schedule|jobs|reminders)",
    ),
    (
        "list",
        "fr",
        r"qu'est-ce qui est (?:prevu|planifie)\s*\??|quoi de prevu\s*\??"
        r"|qu'y a-t-il de prevu\s*\??",
    ),
    ("cancel", "en", r"(?:cancel|stop|delete)\s+(?P<target>[\w.-]*\d[\w.-]*)"),
    ("cancel", "fr", r"(?:annule|arrete|supprime)\s+(?P<target>[\w.-]*\d[\w.-]*)"),
]
_PATTERNS = [(kind, lang, re.compile(pattern)) for kind, lang, pattern in _PHRASES]

#: What joins a reminder's time and its text: ``remind me <when> to <what>``.
_REMIND_JOIN = {
    "en": re.compile(r"\s+(?:to|that|about)\s+"),
    "fr": re.compile(r"\s+(?:de|que)\s+|\s+(?:d|qu)'"),
}
_REMIND_LEAD = {
    "en": re.compile(r"(?:to|that|about)\s+"),
    "fr": re.compile(r"(?:de|que)\s+|(?:d|qu)'"),
}
#: What joins a schedule's time and its message: ``<when> say <what>``.
_SAY_JOIN = {
    "en": re.compile(r"\s*,?\s+(?:say|tell me|post)\s+"),
    "fr": re.compile(r"\s*,?\s+(?:dis|dites|ecris|envoie)(?:-moi)?\s+"),
}
_SAY_LEAD = {
    "en": re.compile(r"(?:say|tell me|post)\s+"),
    "fr": re.compile(r"(?:dis|dites|ecris|envoie)(?:-moi)?\s+"),
}


def read_request(text: str) -> Request | None:
    """The request ``text`` makes, or None when it is none the demo knows (or it is longer
    than ``MAX_REQUEST_CHARS``).

    Args:
        text: what the user wrote.
    """
    original = " ".join(text.split()).rstrip(".!")
    if len(original) > MAX_REQUEST_CHARS:
        return None
    folded = _fold(original)
    for kind, lang, pattern in _PATTERNS:
        m = pattern.fullmatch(folded)
        if m is None:
            continue

        def group(name: str, m: re.Match[str] = m) -> str:
            if name not in m.re.groupindex:
                return ""
            start, end = m.span(name)
            return original[start:end].strip() if start >= 0 else ""

        if kind == "remind":
            found = _split_time(original, folded, m.start("rest"), _REMIND_JOIN[lang], True)
            found = found or _split_time(original, folded, m.start("rest"), _REMIND_LEAD[lang])
            if found is None:
                return None
            when, what = found
            repeats = time_kind(when) == "cron"
            return Request(kind=kind, lang=lang, when=when, what=what, repeats=repeats)
        if kind in ("watch", "fetch"):
            return Request(kind=kind, lang=lang, url=group("url"), every=group("every"))
        if kind == "remember":
            return Request(kind=kind, lang=lang, what=group("what") or group("what2"))
        if kind == "cancel":
            return Request(kind=kind, lang=lang, target=group("target"))
        return Request(kind=kind, lang=lang)
    langs: tuple[Lang, ...] = ("en", "fr")
    for lang in langs:
        found = _split_time(original, folded, 0, _SAY_JOIN[lang], True)
        found = found or _split_time(original, folded, 0, _SAY_LEAD[lang])
        if found is not None:
            when, what = found
            return Request(
                kind="schedule",
                lang=lang,
                when=when,
                what=what,
                repeats=time_kind(when) == "cron",
            )
    return None


def _split_time(
    original: str, folded: str, start: int, join: re.Pattern[str], when_first: bool = False
) -> tuple[str, str] | None:
    """``(when, what)`` from ``original[start:]``.

    ``when_first``: the text is ``<when><join><what>``, and the first join whose left side is
    a time wins. Otherwise it is ``<join><what> <when>``: the join leads, and ``when`` is the
    longest run of last words that is a time.
    """
    if when_first:
        splits = [
            (original[start : m.start()].strip(), original[m.end() :].strip())
            for m in join.finditer(folded, start)
        ]
    else:
        lead = join.match(folded, start)
        if lead is None:
            return None
        body = original[lead.end() :]
        cuts = [m.start() for m in re.finditer(r"(?<=\s)\S", body)]  # leftmost: longest time
        splits = [(body[cut:].strip(), body[:cut].strip()) for cut in cuts]
    splits = [(when, what) for when, what in splits if when and what]
    readings = [_reading(when) for when, _ in splits]
    # a time the parser takes first; else one it understands but refuses (the tool says why)
    for usable in (True, False):
        for split, reading in zip(splits, readings, strict=True):
            if reading is not None and reading[1] is usable:
                return split
    return None
