"""The words of the lexical search index, partitioned by user inside the tokens.

One function, :func:`words`, turns text into the words the index holds and a query asks for,
on both backends, so that a fact and a query are always cut and folded the same way: case
folded (``str.casefold``), diacritics stripped (NFKD, combining marks dropped: ``Café`` is
``cafe``), split on everything that is not a letter or a digit (``foo_bar`` is two words,
``it's`` is ``it`` and ``s``), each word at most :data:`MAX_WORD_CHARS` characters.

The index does not hold the words themselves but each glued to its owner's tag,
:func:`owner_tag` (``"o"`` and the first 8 hex digits of the owner's SHA-256, always 9
characters, so a token splits back into tag and word unambiguously): ``o1a2b3c4dcoffee``. A
search for owner O and word w looks up ``tag(O) + w`` (a word start: every token beginning
with it), whose list of facts holds only O's facts with that word: what a search costs follows
that user's matches, never the other users'. Two owners whose tags collide (one pair in about
4 billion) share their lists: that costs selectivity, never privacy, since every search still
filters on the owner.

A token is a run of letters and digits, so neither backend cuts it again: SQLite's FTS5
``ascii`` tokenizer (every non-ASCII character is a token character, ASCII letters and digits
too) and PostgreSQL's ``array_to_tsvector`` (which takes the lexemes as given, no parser).
At most :data:`MAX_TOKENS` tokens are kept per fact (category, then key, then value).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = [
    "MAX_TERMS",
    "MAX_TOKENS",
    "MAX_WORD_CHARS",
    "TAG_CHARS",
    "fact_tokens",
    "fact_words",
    "owner_tag",
    "query_words",
    "words",
]

#: The longest word kept (longer ones are cut, in facts and queries alike).
MAX_WORD_CHARS = 64
#: The most tokens a fact puts in the index.
MAX_TOKENS = 512
#: The most distinct words of a query that are searched for.
MAX_TERMS = 16
#: A tag's length: ``"o"`` and 8 hex digits.
TAG_CHARS = 9

_WORD = re.compile(r"[^\W_]+")


def owner_tag(owner: str) -> str:
    """The owner's tag: ``"o"`` and the first 8 hex digits of SHA-256 of the name."""
    return "o" + hashlib.sha256(owner.encode()).hexdigest()[:8]


def _fold(text: str) -> str:
    if text.isascii():
        return text.lower()  # casefold and NFKD change nothing else in ASCII
    folded = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in folded if not unicodedata.combining(c))


def words(text: str) -> list[str]:
    """The words of ``text`` as the index holds them: folded, in order, repeats kept."""
    return [w[:MAX_WORD_CHARS] for w in _WORD.findall(_fold(text))]


def query_words(query: str) -> list[str]:
    """The words a search asks for: ``words(query)``, first occurrences, at most
    ``MAX_TERMS``."""
    seen: dict[str, None] = {}
    for word in words(query):
        seen.setdefault(word, None)
        if len(seen) == MAX_TERMS:
            break
    return list(seen)


def fact_words(category: str, key: str, value: str) -> tuple[list[str], list[str], list[str]]:
    """The fact's words per column (category, key, value), at most ``MAX_TOKENS`` in all."""
    room = MAX_TOKENS
    out = []
    for text in (category, key, value):
        kept = words(text)[:room]
        room -= len(kept)
        out.append(kept)
    return out[0], out[1], out[2]


def fact_tokens(owner: str, category: str, key: str, value: str) -> tuple[str, str, str]:
    """The fact's tokens as the index holds them, one space-separated string per column
    (category, key, value): ``fact_words`` each glued to the owner's tag."""
    tag = owner_tag(owner)
    c, k, v = (" ".join(tag + w for w in column) for column in fact_words(category, key, value))
    return c, k, v
