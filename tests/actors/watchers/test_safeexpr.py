"""The watcher threshold language: parsing, exact errors, evaluation, and no code execution."""

from __future__ import annotations

import ast
import builtins
import inspect
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.actors.watchers import safeexpr
from turnstile.actors.watchers.safeexpr import ExprError, compile_expr

RESULT = {
    "status_code": 200,
    "count": 150,
    "ratio": 0.25,
    "error": None,
    "ok": True,
    "status": "live",
    "headers": {"content-type": "application/json"},
    "body": {"items": [{"price": 9.5, "name": "a"}, {"price": 12}], "currency": "EUR"},
    "tags": ["x", "y"],
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("result.status_code == 200", True),
        ("result.status_code != 200", False),
        ("result.count > 100", True),
        ("result.count >= 150", True),
        ("result.count < 150", False),
        ("result.count <= 150", True),
        ("result.ratio < 0.3", True),
        ("result.ratio > -1", True),
        ("result.ratio == 2.5e-1", True),
        ("result.status_code == 200.0", True),
        ("result.error == null", True),
        ("result.error != null", False),
        ("result.ok == true", True),
        ("result.ok == 1", False),  # a boolean is not a number
        ("result.status == 'live'", True),
        ('result.status == "live"', True),
        ("result.status > 'abc'", True),  # strings order with strings
        ("result.status > 5", False),  # ... never with numbers
        ("result.status == 5", False),
        ("result.status != 5", True),
        ("result.error < 1", False),
        ("result.body.items.0.price >= 9.5", True),
        ("result.body.items.1.price == 12", True),
        ("result.body.currency == 'EUR'", True),
        ("result.headers.content-type == 'application/json'", True),
        ("result.tags.1 == 'y'", True),
        # A missing path makes its comparison false, whatever the operator.
        ("result.missing == null", False),
        ("result.missing != null", False),
        ("result.body.items.5.price > 0", False),
        ("result.status.length > 0", False),
        ("result.tags.x == 1", False),
        ("not (result.missing == 1)", True),
        # Boolean structure.
        ("result.count > 100 and result.status == 'live'", True),
        ("result.count > 200 or result.status == 'live'", True),
        ("result.count > 200 or result.status == 'dead'", False),
        ("not result.count > 200", True),
        ("not not result.count > 200", False),
        ("(result.count > 200 or result.ok == true) and result.error == null", True),
        ("result.count > 200 or result.ok == true and result.error != null", False),
        ("  result.count\t>\n100  ", True),
        ("100 < result.count", True),
        ("result.count == result.count", True),
        ("'a\\'b' == \"a'b\"", True),
        ("'\\u00e9\\n' == \"é\\n\"", True),
    ],
)
def test_valid_expressions(text, expected):
    assert compile_expr(text).evaluate(RESULT) is expected


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("", "expected a value at position 0", 0),
        (
            "result.status_code",
            "expected a comparison operator (==, !=, >, <, >=, <=) at position 18",
            18,
        ),
        ("result.status_code ==", "expected a value at position 21", 21),
        ("result.status_code => 200", "unknown operator '=>' at position 19", 19),
        ("result.a = 1", "unknown operator '=' at position 9", 9),
        ("result.a === 1", "unknown operator '===' at position 9", 9),
        ("result.a <> 1", "unknown operator '<>' at position 9", 9),
        ("x == 'abc", "unknown name 'x' (paths start with 'result') at position 0", 0),
        ("result.a == 'abc", "unterminated string at position 12", 12),
        ('result.a == "abc\\"', "unterminated string at position 12", 12),
        ("result.a == 'a\\qb'", "unknown escape '\\q' at position 14", 14),
        ("result.a == '\\u12'", "expected 4 hex digits after '\\u' at position 13", 13),
        ("result.a == and", "expected a value at position 12, found 'and'", 12),
        ("result.a == 1 and", "expected a value at position 17", 17),
        ("result.a == 1 == 2", "comparisons cannot be chained; use 'and' at position 14", 14),
        ("(result.a == 1", "expected ')' at position 14", 14),
        ("(result.a == 1 result.b", "expected ')' at position 15, found 'result.b'", 15),
        ("result.a == 1)", "expected 'and', 'or' or the end at position 13, found ')'", 13),
        ("result. == 1", "expected a name or an index after '.' at position 7", 7),
        ("result.a..b == 1", "expected a name or an index after '.' at position 9", 9),
        ("result.0a == 1", "malformed path segment '0a' at position 7", 7),
        ("result.a == 007", "malformed number '007' at position 12", 12),
        ("result.a == 1.2.3", "malformed number '1.2.3' at position 12", 12),
        ("result.a == -", "expected a number after '-' at position 12", 12),
        ("result.a == 1e999", "number '1e999' is out of range at position 12", 12),
        ("result.a == $", "unexpected character '$' at position 12", 12),
        ("result.a == None", "unknown name 'None' (paths start with 'result') at position 12", 12),
        (
            "__import__('os') == 1",
            "unknown name '__import__' (paths start with 'result') at position 0",
            0,
        ),
        ("result.__class__ == 1 or", "expected a value at position 24", 24),
        (
            "result.a == 1 result.b == 2",
            "expected 'and', 'or' or the end at position 14, found 'result.b'",
            14,
        ),
        ("result", "expected a comparison operator (==, !=, >, <, >=, <=) at position 6", 6),
        ("(" * 33 + "result.a == 1" + ")" * 33, "nested deeper than 32 levels at position 32", 32),
        (
            "result." + ".".join(["a"] * 21) + " == 1",
            "path deeper than 20 segments at position 47",
            47,
        ),
        (
            "result.a == '" + "x" * 490 + "'",
            "expression longer than 500 characters at position 500",
            500,
        ),
    ],
)
def test_invalid_expressions(text, message, position):
    with pytest.raises(ExprError) as caught:
        compile_expr(text)
    assert str(caught.value) == message
    assert caught.value.position == position
    assert caught.value.field == "expression"
    assert caught.value.code == "bad_expression"


def test_limits_are_inclusive():
    twenty = "result." + ".".join(["a"] * 20) + " == 1"
    assert compile_expr(twenty).evaluate({}) is False
    padded = "result.a == 1" + " " * (500 - 13)
    assert len(padded) == 500
    assert compile_expr(padded).evaluate({"a": 1}) is True
    nested = "(" * 32 + "result.a == 1" + ")" * 32
    assert compile_expr(nested).evaluate({"a": 1}) is True


def test_evaluation_never_reaches_into_objects():
    class Sneaky:
        status = 1

        def __getattr__(self, name):  # pragma: no cover - must never be called
            raise AssertionError(f"attribute {name} was read")

    expr = compile_expr("result.status == 1")
    assert expr.evaluate(Sneaky()) is False
    assert compile_expr("result.a.__class__ == 1").evaluate({"a": 1}) is False
    assert expr.evaluate(None) is False
    assert compile_expr("result == 5").evaluate(5) is True  # the whole result is a path too


def test_the_module_never_evaluates_code():
    tree = ast.parse(inspect.getsource(safeexpr))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not names & {"eval", "exec", "compile", "__import__", "getattr", "ast"}
    assert not attributes & {"eval", "exec", "literal_eval", "__getattribute__"}


_PIECES = [
    "result",
    "result.a",
    "result.b.0",
    ".",
    "==",
    "!=",
    ">",
    "<",
    ">=",
    "<=",
    "=",
    "!",
    "=>",
    "and",
    "or",
    "not",
    "(",
    ")",
    "null",
    "true",
    "false",
    "'s'",
    '"t"',
    "'",
    '"',
    "\\",
    "1",
    "-2.5",
    "1e3",
    "-",
    "__import__",
    "os",
    "eval(",
    ";",
    " ",
    "\t",
    "\n",
    "$",
    "é",
    "\x00",
]
_OPERANDS = st.sampled_from(
    ["result", "result.a", "result.b.0", "result.a.b", "1", "-2.5", "1e3", "'s'", '"t"', "null"]
    + ["true", "false"]
)
_COMPARISONS = st.builds(
    lambda a, op, b: f"{a} {op} {b}",
    _OPERANDS,
    st.sampled_from(["==", "!=", ">", "<", ">=", "<="]),
    _OPERANDS,
)
_GRAMMATICAL = st.recursive(
    _COMPARISONS,
    lambda inner: (
        st.builds(lambda a, b: f"{a} and {b}", inner, inner)
        | st.builds(lambda a, b: f"{a} or {b}", inner, inner)
        | inner.map(lambda a: f"not {a}")
        | inner.map(lambda a: f"({a})")
    ),
    max_leaves=6,
)


@st.composite
def _mutated(draw):
    """A grammatical expression with one piece inserted or one character removed."""
    text = draw(_GRAMMATICAL)
    at = draw(st.integers(0, len(text)))
    if draw(st.booleans()):
        return text[:at] + draw(st.sampled_from(_PIECES)) + text[at:]
    return text[:at] + text[at + 1 :]


_EXPRESSIONS = st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(_PIECES), max_size=25).map(" ".join),
    st.lists(st.sampled_from(_PIECES), max_size=25).map("".join),
    _GRAMMATICAL,
    _mutated(),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "0", "1"]), children, max_size=3)
    ),
    max_leaves=10,
)


def _forbidden(*args, **kwargs):
    raise AssertionError("code evaluation attempted")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_EXPRESSIONS, result=_JSON)
def test_random_text_raises_only_expr_error_and_never_runs_code(text, result):
    with (
        mock.patch.object(builtins, "eval", _forbidden),
        mock.patch.object(builtins, "exec", _forbidden),
        mock.patch.object(builtins, "compile", _forbidden),
    ):
        try:
            expr = compile_expr(text)
        except ExprError as exc:
            assert 0 <= exc.position <= len(text)
            assert f"at position {exc.position}" in str(exc)
            return
        assert isinstance(expr.evaluate(result), bool)
        assert isinstance(expr.evaluate({"a": result, "b": [result]}), bool)
