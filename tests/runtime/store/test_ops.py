"""Operations: SQL written once with named placeholders, compiled for each backend."""

from __future__ import annotations

import pytest

from turnstile.runtime.store import ops
from turnstile.runtime.store.ops import Statement


@pytest.mark.parametrize(
    ("text", "sqlite", "postgres", "params"),
    [
        (
            "SELECT * FROM t WHERE id = :id",
            "SELECT * FROM t WHERE id = ?1",
            "SELECT * FROM t WHERE id = $1",
            ("id",),
        ),
        # numbered in the order they first appear; a name used twice is one parameter
        (
            "UPDATE t SET a = :a, at = :now WHERE id = :id AND at < :now",
            "UPDATE t SET a = ?1, at = ?2 WHERE id = ?3 AND at < ?2",
            "UPDATE t SET a = $1, at = $2 WHERE id = $3 AND at < $2",
            ("a", "now", "id"),
        ),
        # a cast right after a placeholder is PostgreSQL's; other casts are left alone
        (
            "SELECT (v->>'n')::int FROM t (:o::text IS NULL OR o = :o) AND s = ANY(:s::text[])",
            "SELECT (v->>'n')::int FROM t (?1 IS NULL OR o = ?1) AND s = ANY(?2)",
            "SELECT (v->>'n')::int FROM t ($1::text IS NULL OR o = $1) AND s = ANY($2::text[])",
            ("o", "s"),
        ),
        # quoted text, quoted names and comments are not placeholders
        (
            "SELECT ':no', \"a:b\", json_set(p, '$.x', :x) -- see :note\nFROM t",
            "SELECT ':no', \"a:b\", json_set(p, '$.x', ?1) -- see :note\nFROM t",
            "SELECT ':no', \"a:b\", json_set(p, '$.x', $1) -- see :note\nFROM t",
            ("x",),
        ),
        ("SELECT 1", "SELECT 1", "SELECT 1", ()),
    ],
)
def test_placeholders_are_compiled_for_each_backend(text, sqlite, postgres, params):
    stmt = Statement(text)
    assert (stmt.sqlite, stmt.postgres, stmt.params) == (sqlite, postgres, params)


def test_params_give_the_order_of_the_positional_values():
    stmt = Statement("UPDATE t SET a = :a WHERE id = :id", params=("id", "a"))
    assert stmt.postgres == "UPDATE t SET a = $2 WHERE id = $1"
    assert stmt.sqlite == "UPDATE t SET a = ?2 WHERE id = ?1"
    assert stmt.values({"a": 1, "id": "x", "unused": 3}) == ("x", 1)
    assert Statement("SELECT :one").values({"one": 1}) == (1,)
    assert Statement("SELECT 1").values({"any": 1}) == ()


@pytest.mark.parametrize(
    ("text", "params", "error"),
    [
        ("SELECT * FROM t WHERE id = $1", None, r"write placeholders as :name, not '\$1'"),
        ("SELECT * FROM t WHERE id = ?", None, r"write placeholders as :name, not '\?'"),
        ("SELECT :a, :b", ("a",), r"params \('a',\) do not match the placeholders \('a', 'b'\)"),
        ("SELECT :a", ("a", "b"), r"params \('a', 'b'\) do not match the placeholders \('a',\)"),
        ("SELECT :a", ("a", "a"), r"params \('a', 'a'\) do not match"),
    ],
)
def test_a_malformed_statement_is_refused_where_it_is_written(text, params, error):
    with pytest.raises(ValueError, match=error):
        Statement(text, params=params)


def test_an_operation_says_what_it_is():
    op = ops.row("t.get", "SELECT * FROM t WHERE id = :id", decode=dict)
    assert (op.name, op.writes, op.first) == ("t.get", False, False)
    assert op.decode is not None and op.decode(None) is None
    assert ops.rows("t.all", "SELECT 1", decode=tuple).decode([(1,), (2,)]) == [(1,), (2,)]
    assert ops.count("t.drop", "DELETE FROM t").writes  # count and execute write by default
    assert ops.execute("t.touch", "UPDATE t SET n = 1").writes
    one = ops.procedure("t.p", sqlite=len, postgres=None, first=True)
    assert one.first and one.backends == {"sqlite"}
    with pytest.raises(TypeError, match="operation 't.p' does not run on postgres"):
        one.postgres(None)
    with pytest.raises(ValueError, match="operation 't.none' has no SQL"):
        ops.value("t.none")
    with pytest.raises(ValueError, match="operation 't.nowhere' runs on no backend"):
        ops.procedure("t.nowhere", sqlite=None, postgres=None)
    with pytest.raises(TypeError, match="operation 't.p': sqlite must be a function"):
        ops.procedure("t.p", sqlite="SELECT 1", postgres=None)


def test_one_backends_own_sql():
    op = ops.found(
        "t.stop",
        sqlite="UPDATE t SET at = min(at, :now) WHERE id = :id RETURNING 1",
        postgres="UPDATE t SET at = least(at, now()) WHERE id = :id RETURNING 1",
    )
    assert op.backends == {"sqlite", "postgres"}
    assert op.sqlite.args[1].sqlite == "UPDATE t SET at = min(at, ?1) WHERE id = ?2 RETURNING 1"
    assert op.postgres.args[1].postgres == (
        "UPDATE t SET at = least(at, now()) WHERE id = $1 RETURNING 1"
    )
