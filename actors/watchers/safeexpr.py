"""A small, safe expression language for watcher thresholds (``notify_when: on_threshold``).

An expression compares values taken from a tool's result::

    result.status_code != 200
    result.body.items.0.price >= 9.5 and result.body.currency == "EUR"
    not (result.error == null) or result.count > 100

Grammar (``compile_expr`` parses it once with a tokenizer and a recursive-descent parser;
nothing is ever handed to ``eval``, ``exec`` or ``ast.literal_eval``)::

    expression := or_expr END
    or_expr    := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | "(" or_expr ")" | comparison
    comparison := operand ("==" | "!=" | ">" | "<" | ">=" | "<=") operand
    operand    := path | number | string | "null" | "true" | "false"
    path       := "result" ("." segment)*        segment: name (letters, digits, _ and -)
                                                  or a list index (digits)

Numbers are JSON-like (``-3``, ``2.5``, ``1e3``); strings are quoted with ``'`` or ``"`` and
know the escapes ``\\\\ \\' \\" \\n \\r \\t \\/ \\uXXXX``. ``and`` / ``or`` / ``not`` and
parentheses are supported; comparisons cannot be chained (``1 < x < 3`` is an error).

Evaluation (``Expr.evaluate(result) -> bool``) never raises:

* a path that does not exist in the result (a missing key, an index past the end, a segment
  into a string or number) makes the comparison that uses it **false**, whatever the
  operator — ``result.error != null`` is false when there is no ``error`` at all. Wrap it in
  ``not (...)`` to ask "missing or different";
* ``==`` / ``!=`` compare values of different kinds as unequal (``true`` is not ``1``,
  ``"1"`` is not ``1``); ints and floats are both numbers (``1 == 1.0``);
* ``>`` ``<`` ``>=`` ``<=`` order numbers with numbers and strings with strings; any other
  pairing (a string and a number, null, booleans, lists, objects) is false.

Path segments only look up dict keys and list indexes of plain data (what a tool result is
after ``msgspec.to_builtins``); attributes are never read, so an expression cannot reach
into Python objects.

Limits: an expression is at most 500 characters, a path at most 20 segments after
``result``, and ``not`` / parentheses nest at most 32 deep. Every problem is an
``ExprError`` naming the 0-based position and what was expected there.

It is over 400 lines because it is one small language (lexer, parser, evaluator and their limits)
whose grammar and never-raise rules above are checked against the code in one read; nothing else
uses its parts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnstile.runtime.errors import TurnstileError

__all__ = ["Expr", "ExprError", "compile_expr", "MAX_EXPRESSION_CHARS", "MAX_PATH_DEPTH"]

MAX_EXPRESSION_CHARS = 500
MAX_PATH_DEPTH = 20
MAX_NESTING = 32


class ExprError(TurnstileError, ValueError):
    """An expression that cannot be compiled.

    Attributes:
        position: 0-based index into the expression where the problem is.
        field: always ``"expression"`` (the tool argument that carries it).
    """

    code = "bad_expression"

    def __init__(self, message: str, position: int, found: str | None = None) -> None:
        suffix = f", found {found}" if found else ""
        super().__init__(f"{message} at position {position}{suffix}")
        self.position = position
        self.field = "expression"


# ---------------------------------------------------------------------------------------------
# Tokens

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_OPERATOR_CHARS = "=!<>"
_OPERATORS = ("==", "!=", ">=", "<=", ">", "<")
_KEYWORDS = {"and", "or", "not", "null", "true", "false"}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t", "/": "/"}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "path" "number" "string" "keyword" "op" "(" ")" "end"
    value: Any
    position: int
    text: str


def _found(token: _Token) -> str | None:
    """What stands where something else was expected (nothing to say at the end)."""
    return None if token.kind == "end" else repr(token.text)


class _Lexer:
    """Turns text into tokens on demand, so the first problem in reading order is reported."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.index = 0
        self._peeked: _Token | None = None

    def peek(self) -> _Token:
        if self._peeked is None:
            self._peeked = self._read()
        return self._peeked

    def take(self) -> _Token:
        token = self.peek()
        self._peeked = None
        return token

    def _read(self) -> _Token:
        text = self.text
        i = self.index
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        self.index = i
        if i >= len(text):
            return _Token("end", None, i, "")
        ch = text[i]
        if ch in "()":
            self.index = i + 1
            return _Token(ch, ch, i, ch)
        if ch in _OPERATOR_CHARS:
            j = i
            while j < len(text) and text[j] in _OPERATOR_CHARS:
                j += 1
            op = text[i:j]
            if op not in _OPERATORS:
                raise ExprError(f"unknown operator {op!r}", i)
            self.index = j
            return _Token("op", op, i, op)
        if ch in "'\"":
            return self._string(i)
        if ch == "-" or ch in "0123456789":
            return self._number(i)
        if ch.isascii() and (ch.isalpha() or ch == "_"):
            return self._word(i)
        raise ExprError(f"unexpected character {ch!r}", i)

    def _number(self, i: int) -> _Token:
        match = _NUMBER.match(self.text, i)
        if match is None:  # a lone "-" or "-x"
            raise ExprError("expected a number after '-'", i)
        end = match.end()
        if end < len(self.text) and (self.text[end].isalnum() or self.text[end] in "._"):
            j = end
            while j < len(self.text) and (self.text[j].isalnum() or self.text[j] in "._-"):
                j += 1
            raise ExprError(f"malformed number {self.text[i:j]!r}", i)
        literal = match.group()
        if any(c in literal for c in ".eE"):
            value: int | float = float(literal)
        else:
            value = int(literal)
        self.index = end
        return _Token("number", value, i, literal)

    def _string(self, i: int) -> _Token:
        text = self.text
        quote = text[i]
        out: list[str] = []
        j = i + 1
        while j < len(text):
            ch = text[j]
            if ch == quote:
                self.index = j + 1
                return _Token("string", "".join(out), i, text[i : j + 1])
            if ch == "\\":
                if j + 1 >= len(text):
                    break
                esc = text[j + 1]
                if esc in _ESCAPES:
                    out.append(_ESCAPES[esc])
                    j += 2
                    continue
                if esc == "u":
                    digits = text[j + 2 : j + 6]
                    if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
                        out.append(chr(int(digits, 16)))
                        j += 6
                        continue
                    raise ExprError("expected 4 hex digits after '\\u'", j)
                raise ExprError(f"unknown escape '\\{esc}'", j)
            out.append(ch)
            j += 1
        raise ExprError("unterminated string", i)

    def _word(self, i: int) -> _Token:
        match = _NAME.match(self.text, i)
        assert match is not None
        word = match.group()
        if word in _KEYWORDS:
            self.index = match.end()
            return _Token("keyword", word, i, word)
        if word != "result":
            raise ExprError(f"unknown name {word!r} (paths start with 'result')", i)
        segments: list[str | int] = []
        j = match.end()
        while j < len(self.text) and self.text[j] == ".":
            seg = _SEGMENT.match(self.text, j + 1)
            if seg is None:
                raise ExprError("expected a name or an index after '.'", j + 1)
            if len(segments) == MAX_PATH_DEPTH:
                raise ExprError(f"path deeper than {MAX_PATH_DEPTH} segments", j + 1)
            name = seg.group()
            if name.isdigit():
                segments.append(int(name))
            elif name[0].isdigit():
                raise ExprError(f"malformed path segment {name!r}", j + 1)
            else:
                segments.append(name)
            j = seg.end()
        self.index = j
        return _Token("path", tuple(segments), i, self.text[i:j])


# ---------------------------------------------------------------------------------------------
# Syntax tree and evaluation


class _Missing:
    """A path that leads nowhere."""


_MISSING = _Missing()


@dataclass(frozen=True, slots=True)
class _Path:
    segments: tuple[str | int, ...]

    def value(self, result: Any) -> Any:
        current = result
        for segment in self.segments:
            if isinstance(current, dict):
                key = str(segment)
                if key not in current:
                    return _MISSING
                current = current[key]
            elif isinstance(current, (list, tuple)) and isinstance(segment, int):
                if segment >= len(current):
                    return _MISSING
                current = current[segment]
            else:
                return _MISSING
        return current


@dataclass(frozen=True, slots=True)
class _Literal:
    literal: Any

    def value(self, result: Any) -> Any:
        return self.literal


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _equal(a: Any, b: Any) -> bool:
    kind = _kind(a)
    if kind != _kind(b):
        return False
    if kind == "other":
        try:
            return bool(a == b)
        except Exception:  # exotic containers; plain data never gets here
            return False
    return a == b


def _orderable(a: Any, b: Any) -> bool:
    kind = _kind(a)
    return kind == _kind(b) and kind in ("number", "string")


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": _equal,
    "!=": lambda a, b: not _equal(a, b),
    ">": lambda a, b: _orderable(a, b) and a > b,
    "<": lambda a, b: _orderable(a, b) and a < b,
    ">=": lambda a, b: _orderable(a, b) and a >= b,
    "<=": lambda a, b: _orderable(a, b) and a <= b,
}


@dataclass(frozen=True, slots=True)
class _Compare:
    left: _Path | _Literal
    op: str
    right: _Path | _Literal

    def test(self, result: Any) -> bool:
        a = self.left.value(result)
        b = self.right.value(result)
        if a is _MISSING or b is _MISSING:
            return False
        return _COMPARE[self.op](a, b)


@dataclass(frozen=True, slots=True)
class _Not:
    inner: Any

    def test(self, result: Any) -> bool:
        return not self.inner.test(result)


@dataclass(frozen=True, slots=True)
class _All:
    items: tuple[Any, ...]

    def test(self, result: Any) -> bool:
        return all(item.test(result) for item in self.items)


@dataclass(frozen=True, slots=True)
class _Any:
    items: tuple[Any, ...]

    def test(self, result: Any) -> bool:
        return any(item.test(result) for item in self.items)


class Expr:
    """A compiled expression; ``evaluate`` it against as many results as you like.

    Attributes:
        text: the source text.
    """

    __slots__ = ("text", "_root")

    def __init__(self, text: str, root: Any) -> None:
        self.text = text
        self._root = root

    def evaluate(self, result: Any) -> bool:
        """Whether the expression holds for ``result`` (plain data: dicts, lists, scalars).

        A comparison that uses a missing path is false; see the module docstring.
        """
        return bool(self._root.test(result))

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


# ---------------------------------------------------------------------------------------------
# Parser


class _Parser:
    def __init__(self, text: str) -> None:
        self.lexer = _Lexer(text)
        self.depth = 0

    def parse(self) -> Any:
        node = self._or()
        token = self.lexer.peek()
        if token.kind == "op":
            raise ExprError("comparisons cannot be chained; use 'and'", token.position)
        if token.kind != "end":
            raise ExprError("expected 'and', 'or' or the end", token.position, _found(token))
        return node

    def _or(self) -> Any:
        items = [self._and()]
        while self._keyword("or"):
            items.append(self._and())
        return items[0] if len(items) == 1 else _Any(tuple(items))

    def _and(self) -> Any:
        items = [self._not()]
        while self._keyword("and"):
            items.append(self._not())
        return items[0] if len(items) == 1 else _All(tuple(items))

    def _not(self) -> Any:
        token = self.lexer.peek()
        if token.kind == "keyword" and token.value == "not":
            self.lexer.take()
            with self._nested(token):
                return _Not(self._not())
        if token.kind == "(":
            self.lexer.take()
            with self._nested(token):
                node = self._or()
            closing = self.lexer.peek()
            if closing.kind != ")":
                if closing.kind == "op":
                    raise ExprError("comparisons cannot be chained; use 'and'", closing.position)
                raise ExprError("expected ')'", closing.position, _found(closing))
            self.lexer.take()
            return node
        return self._comparison()

    def _comparison(self) -> _Compare:
        left = self._operand()
        token = self.lexer.peek()
        if token.kind != "op":
            raise ExprError(
                "expected a comparison operator (==, !=, >, <, >=, <=)",
                token.position,
                _found(token),
            )
        self.lexer.take()
        right = self._operand()
        return _Compare(left, token.value, right)

    def _operand(self) -> _Path | _Literal:
        token = self.lexer.peek()
        if token.kind == "path":
            self.lexer.take()
            return _Path(token.value)
        if token.kind in ("number", "string"):
            self.lexer.take()
            if isinstance(token.value, float) and not math.isfinite(token.value):
                raise ExprError(f"number {token.text!r} is out of range", token.position)
            return _Literal(token.value)
        if token.kind == "keyword" and token.value in ("null", "true", "false"):
            self.lexer.take()
            return _Literal({"null": None, "true": True, "false": False}[token.value])
        raise ExprError("expected a value", token.position, _found(token))

    def _keyword(self, word: str) -> bool:
        token = self.lexer.peek()
        if token.kind == "keyword" and token.value == word:
            self.lexer.take()
            return True
        return False

    def _nested(self, token: _Token) -> _Depth:
        return _Depth(self, token.position)


class _Depth:
    """Counts nesting of ``not`` and parentheses so deep input cannot exhaust the stack."""

    __slots__ = ("parser", "position")

    def __init__(self, parser: _Parser, position: int) -> None:
        self.parser = parser
        self.position = position

    def __enter__(self) -> None:
        self.parser.depth += 1
        if self.parser.depth > MAX_NESTING:
            raise ExprError(f"nested deeper than {MAX_NESTING} levels", self.position)

    def __exit__(self, *exc: object) -> None:
        self.parser.depth -= 1


def compile_expr(text: str) -> Expr:
    """Parse ``text`` into an ``Expr``.

    Raises:
        ExprError: the text is too long or malformed; the message names the position.
    """
    if not isinstance(text, str):
        raise ExprError("an expression must be a string", 0)
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExprError(
            f"expression longer than {MAX_EXPRESSION_CHARS} characters", MAX_EXPRESSION_CHARS
        )
    return Expr(text, _Parser(text).parse())
