"""Store operations: one typed object per query, which either backend runs.

An :class:`Operation` is everything the store needs to run one query: what to do on SQLite,
what to do on PostgreSQL, and how to turn the answer into what the caller gets. The kernel's
own operations (``runtime/store/sessions.py``, ``inbox.py``, ...) and every feature's operations
on its own tables (``actors/<feature>/queries.py``) are the same kind of object, run the same
way, with no name looked up anywhere::

    GET_ITEM = ops.row("get_item", "SELECT * FROM items WHERE id = :item_id", decode=item_record)
    item = await engine.run(GET_ITEM, item_id=5)  # Item | None

**SQL written once.** A statement is written with named placeholders (``:item_id``) and compiled
when it is defined (:class:`Statement`): PostgreSQL gets ``$1``, ``$2``, …, SQLite ``?1``,
``?2``, … with the same numbers, so both take the same positional values. A cast written right
after a placeholder (``:spec::jsonb``, ``:states::text[]``) is PostgreSQL's type for the
parameter; SQLite, which has no such casts, gets the bare placeholder. Quoted text and
comments are left alone. Where the backends need different SQL, each gets its own
(``sqlite=``, ``postgres=``), written the same way.

**Shapes.** The factory says what a statement answers and how the answer is decoded:

* :func:`row`: one row or None, each row decoded by ``decode``;
* :func:`rows`: a list of rows, each decoded;
* :func:`value`: the first column of the first row, or None;
* :func:`count`: how many rows the statement changed;
* :func:`found`: whether the statement answered a row (``… RETURNING 1``);
* :func:`execute`: nothing;
* :func:`procedure`: a function per backend (several statements, a transaction, logic in
  between), whose answer ``decode`` turns into the caller's as a whole.

A side given as a function instead of SQL must answer in the shape (a row or None for
:func:`row`, and so on): SQLite's side is ``fn(conn, **args)``, run in a thread on a
``sqlite3.Connection`` inside the transaction the store manages; PostgreSQL's is ``async
fn(conn, **args)`` on a pooled asyncpg connection on the store's asyncio thread, which opens
``async with conn.transaction():`` itself when it needs one (see
:mod:`runtime.store.postgres` on what a query may not leave behind on its connection).

**Where the work happens.** The backend side runs where the database is (SQLite's writer or
reader thread, PostgreSQL's asyncio thread); ``decode`` runs on the caller's trio thread once the
answer is back, as the front's row mapping always did. Running an operation costs no more than
the hand-written function it replaces: a compiled statement's values are taken from the
arguments by one ``operator.itemgetter`` call, and a function side is called with the
arguments as given.

**Reads and writes.** ``writes=True`` sends the operation through SQLite's writer (group commit,
a savepoint of its own, durable when the call returns); a read runs on a reader connection in
one read transaction (one snapshot). ``first=True`` serves it on PostgreSQL before the
operations already waiting for a connection (a short write whose lateness is measured).

Errors: a database error reaches the caller as ``StoreError``; an argument an operation's SQL
names but the call did not pass is a ``TypeError`` naming both. A placeholder is ``:name``
only: ``$1`` and ``?`` are refused where the statement is written, so PostgreSQL's jsonb
operators ``?``, ``?|`` and ``?&`` are written as their functions (``jsonb_exists``, …).

It is over 400 lines because it is the whole mechanism in one place (the statement compiler, the
operation, one short runner per shape and backend, and the factories with their docstrings), which
a reader of the store learns once.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from operator import itemgetter
from typing import Any, Generic, TypeVar, overload

__all__ = [
    "CHANNEL_SUFFIX_SQL",
    "Operation",
    "Statement",
    "count",
    "execute",
    "found",
    "procedure",
    "renamed",
    "row",
    "rows",
    "scoped_channel_sql",
    "value",
]

T = TypeVar("T")
R = TypeVar("R")

#: SQLite's side of an operation: ``fn(conn, **args) -> answer``, run in a thread.
SqliteSide = Callable[..., Any]
#: PostgreSQL's side: ``async fn(conn, **args) -> answer``, run on the asyncio thread.
PostgresSide = Callable[..., Awaitable[Any]]

# Quoted text, quoted identifiers and comments (kept as they are), or a placeholder with an
# optional cast right after it. A placeholder follows neither a colon (``x::int``) nor a word
# character.
_TOKENS = re.compile(
    r"""('(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*)"""
    r"|(?<![:\w]):([A-Za-z_]\w*)((?:::\w+(?:\[\])?)?)"
)
# Positional placeholders outside quotes: refused, so that a statement has one notation.
_POSITIONAL = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|(\$\d|\?)""")


def _no_values(_args: Mapping[str, Any]) -> tuple[()]:
    return ()


class Statement:
    """One SQL statement with named placeholders, compiled for both backends.

    Args:
        text: the SQL, with ``:name`` placeholders (see the module docstring).
        params: the order of the positional values (``$1`` is ``params[0]``); every
            placeholder must be in it and every name of it must be used. Without it, the
            names are numbered in the order they first appear. Give it when a function calls
            the statement with positional values, so that the order is written down.

    Attributes:
        sqlite: the text for SQLite (``?1``, ``?2``, …; no parameter casts).
        postgres: the text for PostgreSQL (``$1``, ``$2``, …; casts kept).
        params: the names, in the order of their numbers.
        values: ``values(args)`` is the tuple of positional values taken from the mapping
            ``args`` (a ``KeyError`` for a name it lacks).

    Raises:
        ValueError: a placeholder written as ``$1`` or ``?``, or ``params`` that does not
            match the placeholders.
    """

    __slots__ = ("text", "sqlite", "postgres", "params", "values")

    text: str
    sqlite: str
    postgres: str
    params: tuple[str, ...]
    values: Callable[[Mapping[str, Any]], tuple[Any, ...]]

    def __init__(self, text: str, *, params: Sequence[str] | None = None) -> None:
        for match in _POSITIONAL.finditer(text):
            if match.group(1):
                raise ValueError(
                    f"write placeholders as :name, not {match.group(1)!r}, in {text!r}"
                )
        used: list[str] = []
        for match in _TOKENS.finditer(text):
            name = match.group(2)
            if name and name not in used:
                used.append(name)
        if params is None:
            order = tuple(used)
        else:
            order = tuple(params)
            if sorted(order) != sorted(used) or len(set(order)) != len(order):
                raise ValueError(
                    f"params {order} do not match the placeholders {tuple(used)} of {text!r}"
                )
        number = {name: i for i, name in enumerate(order, start=1)}

        def to_sqlite(match: re.Match[str]) -> str:
            name = match.group(2)
            return match.group(1) if name is None else f"?{number[name]}"

        def to_postgres(match: re.Match[str]) -> str:
            name = match.group(2)
            return match.group(1) if name is None else f"${number[name]}{match.group(3)}"

        self.text = text
        self.sqlite = _TOKENS.sub(to_sqlite, text)
        self.postgres = _TOKENS.sub(to_postgres, text)
        self.params = order
        if not order:
            self.values = _no_values
        elif len(order) == 1:
            self.values = partial(_one_value, order[0])
        else:
            self.values = itemgetter(*order)

    def __repr__(self) -> str:
        return f"Statement({self.text!r})"


def _one_value(name: str, args: Mapping[str, Any]) -> tuple[Any]:
    return (args[name],)


def renamed(text: str, prefix: str) -> str:
    """``text`` with each placeholder ``:name`` written ``:<prefix>name`` (its cast kept; quoted
    text and comments left alone): a statement joined into another one, whose placeholders it
    must not meet (``runtime/store/closing.py``, :class:`~runtime.store.closing.ClosingStep`)."""

    def rename(match: re.Match[str]) -> str:
        name = match.group(2)
        return match.group(1) if name is None else f":{prefix}{name}{match.group(3)}"

    return _TOKENS.sub(rename, text)


class Operation(Generic[R]):
    """One query the store runs on either backend; build it with the factories of this module.

    The backends call ``sqlite(conn, **args)`` or ``await postgres(conn, **args)`` where the
    database is, then ``decode(answer)`` (when not None) on the caller's thread; the caller
    gets an ``R``. One operation's side may call another's inside its own transaction (a
    feature's write that also logs it).

    Attributes:
        name: what the operation is called in errors (``"get_session"``, ``"memory.save"``).
        writes: whether it writes (SQLite runs it in the writer's group commit).
        first: served before the operations waiting for a PostgreSQL connection.
        backends: where it runs: ``{"sqlite", "postgres"}``, or one of them.
        sqlite: SQLite's side (where it does not run there, one that raises ``TypeError``).
        postgres: PostgreSQL's side (likewise).
        decode: turns the backend's answer into the caller's, or None to give it as it is.
    """

    __slots__ = ("name", "writes", "first", "backends", "sqlite", "postgres", "decode")

    name: str
    writes: bool
    first: bool
    backends: frozenset[str]
    sqlite: SqliteSide
    postgres: PostgresSide
    decode: Callable[[Any], R] | None

    def __init__(
        self,
        name: str,
        *,
        sqlite: SqliteSide | None,
        postgres: PostgresSide | None,
        decode: Callable[[Any], R] | None = None,
        writes: bool = False,
        first: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("an operation's name must be a non-empty str")
        if sqlite is None and postgres is None:
            raise ValueError(f"operation {name!r} runs on no backend")
        self.name = name
        self.writes = bool(writes)
        self.first = bool(first)
        self.backends = frozenset(
            backend for backend, side in (("sqlite", sqlite), ("postgres", postgres)) if side
        )
        self.sqlite = _Elsewhere(name, "sqlite") if sqlite is None else sqlite
        self.postgres = _Elsewhere(name, "postgres") if postgres is None else postgres
        self.decode = decode

    def __repr__(self) -> str:
        return f"<Operation {self.name}>"


class _Elsewhere:
    """The side of an operation on a backend it does not run on: calling it says so."""

    __slots__ = ("name", "backend")

    def __init__(self, name: str, backend: str) -> None:
        self.name = name
        self.backend = backend

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TypeError(f"operation {self.name!r} does not run on {self.backend}")


# -- running a compiled statement (the sides the factories build) -----------------------------


def _values(name: str, stmt: Statement, args: Mapping[str, Any]) -> tuple[Any, ...]:
    """The statement's positional values from ``args``; a missing one is a TypeError."""
    try:
        return stmt.values(args)
    except KeyError as exc:
        raise TypeError(
            f"operation {name!r} needs the argument {exc.args[0]!r} ({stmt.text!r})"
        ) from None


def _sqlite_row(name: str, stmt: Statement, conn: Any, /, **args: Any) -> Any:
    return conn.execute(stmt.sqlite, _values(name, stmt, args)).fetchone()


def _sqlite_rows(name: str, stmt: Statement, conn: Any, /, **args: Any) -> Any:
    return conn.execute(stmt.sqlite, _values(name, stmt, args)).fetchall()


def _sqlite_value(name: str, stmt: Statement, conn: Any, /, **args: Any) -> Any:
    answer = conn.execute(stmt.sqlite, _values(name, stmt, args)).fetchone()
    return None if answer is None else answer[0]


def _sqlite_count(name: str, stmt: Statement, conn: Any, /, **args: Any) -> int:
    return int(conn.execute(stmt.sqlite, _values(name, stmt, args)).rowcount)


def _sqlite_found(name: str, stmt: Statement, conn: Any, /, **args: Any) -> bool:
    return conn.execute(stmt.sqlite, _values(name, stmt, args)).fetchone() is not None


def _sqlite_execute(name: str, stmt: Statement, conn: Any, /, **args: Any) -> None:
    conn.execute(stmt.sqlite, _values(name, stmt, args))


async def _postgres_row(name: str, stmt: Statement, conn: Any, /, **args: Any) -> Any:
    return await conn.fetchrow(stmt.postgres, *_values(name, stmt, args))


async def _postgres_rows(name: str, stmt: Statement, conn: Any, /, **args: Any) -> Any:
    return await conn.fetch(stmt.postgres, *_values(name, stmt, args))


async def _postgres_value(name: str, stmt: Statement, conn: Any, /, **args: Any) -> Any:
    return await conn.fetchval(stmt.postgres, *_values(name, stmt, args))


async def _postgres_count(name: str, stmt: Statement, conn: Any, /, **args: Any) -> int:
    status = await conn.execute(stmt.postgres, *_values(name, stmt, args))
    return int(status.rpartition(" ")[2])  # "UPDATE 3", "INSERT 0 1"


async def _postgres_found(name: str, stmt: Statement, conn: Any, /, **args: Any) -> bool:
    return await conn.fetchrow(stmt.postgres, *_values(name, stmt, args)) is not None


async def _postgres_execute(name: str, stmt: Statement, conn: Any, /, **args: Any) -> None:
    await conn.execute(stmt.postgres, *_values(name, stmt, args))


_SHAPES: dict[str, tuple[Callable[..., Any], Callable[..., Awaitable[Any]]]] = {
    "row": (_sqlite_row, _postgres_row),
    "rows": (_sqlite_rows, _postgres_rows),
    "value": (_sqlite_value, _postgres_value),
    "count": (_sqlite_count, _postgres_count),
    "found": (_sqlite_found, _postgres_found),
    "execute": (_sqlite_execute, _postgres_execute),
}


def _sides(
    name: str,
    shape: str,
    sql: str | None,
    sqlite: str | SqliteSide | None,
    postgres: str | PostgresSide | None,
) -> tuple[SqliteSide | None, PostgresSide | None]:
    """Each backend's side: its own SQL or function, else the shared ``sql``, compiled."""
    if sql is None and sqlite is None and postgres is None:
        raise ValueError(f"operation {name!r} has no SQL")
    on_sqlite, on_postgres = _SHAPES[shape]
    lite = sql if sqlite is None else sqlite
    pg = sql if postgres is None else postgres
    if isinstance(lite, str):
        lite = partial(on_sqlite, name, Statement(lite))
    if isinstance(pg, str):
        pg = partial(on_postgres, name, Statement(pg))
    return lite, pg


def _decode_row(decode: Callable[[Any], T], answer: Any) -> T | None:
    return None if answer is None else decode(answer)


def _decode_rows(decode: Callable[[Any], T], answer: Any) -> list[T]:
    return [decode(r) for r in answer]


# -- the factories ------------------------------------------------------------------------------


def row(
    name: str,
    sql: str | None = None,
    *,
    sqlite: str | SqliteSide | None = None,
    postgres: str | PostgresSide | None = None,
    decode: Callable[[Any], T],
    writes: bool = False,
    first: bool = False,
) -> Operation[T | None]:
    """An operation answering one row or None; the caller gets ``decode(row)`` or None.

    Args:
        name: the operation's name.
        sql: the statement for both backends (``:name`` placeholders).
        sqlite, postgres: a backend's own statement, or function answering a row or None.
        decode: turns a row (``row["column"]``) into the answer.
        writes, first: see :class:`Operation`.
    """
    lite, pg = _sides(name, "row", sql, sqlite, postgres)
    return Operation(
        name,
        sqlite=lite,
        postgres=pg,
        decode=partial(_decode_row, decode),
        writes=writes,
        first=first,
    )


def rows(
    name: str,
    sql: str | None = None,
    *,
    sqlite: str | SqliteSide | None = None,
    postgres: str | PostgresSide | None = None,
    decode: Callable[[Any], T],
    writes: bool = False,
    first: bool = False,
) -> Operation[list[T]]:
    """An operation answering a list of rows; the caller gets each decoded, in order."""
    lite, pg = _sides(name, "rows", sql, sqlite, postgres)
    return Operation(
        name,
        sqlite=lite,
        postgres=pg,
        decode=partial(_decode_rows, decode),
        writes=writes,
        first=first,
    )


def value(
    name: str,
    sql: str | None = None,
    *,
    sqlite: str | SqliteSide | None = None,
    postgres: str | PostgresSide | None = None,
    writes: bool = False,
    first: bool = False,
) -> Operation[Any]:
    """An operation answering the first column of its first row, or None without a row."""
    lite, pg = _sides(name, "value", sql, sqlite, postgres)
    return Operation(name, sqlite=lite, postgres=pg, writes=writes, first=first)


def count(
    name: str,
    sql: str | None = None,
    *,
    sqlite: str | SqliteSide | None = None,
    postgres: str | PostgresSide | None = None,
    writes: bool = True,
    first: bool = False,
) -> Operation[int]:
    """An operation answering how many rows its statement inserted, changed or deleted."""
    lite, pg = _sides(name, "count", sql, sqlite, postgres)
    return Operation(name, sqlite=lite, postgres=pg, writes=writes, first=first)


def found(
    name: str,
    sql: str | None = None,
    *,
    sqlite: str | SqliteSide | None = None,
    postgres: str | PostgresSide | None = None,
    writes: bool = False,
    first: bool = False,
) -> Operation[bool]:
    """An operation answering whether its statement returned a row (``… RETURNING 1``)."""
    lite, pg = _sides(name, "found", sql, sqlite, postgres)
    return Operation(name, sqlite=lite, postgres=pg, writes=writes, first=first)


def execute(
    name: str,
    sql: str | None = None,
    *,
    sqlite: str | SqliteSide | None = None,
    postgres: str | PostgresSide | None = None,
    writes: bool = True,
    first: bool = False,
) -> Operation[None]:
    """An operation that answers nothing."""
    lite, pg = _sides(name, "execute", sql, sqlite, postgres)
    return Operation(name, sqlite=lite, postgres=pg, writes=writes, first=first)


@overload
def procedure(
    name: str,
    *,
    sqlite: SqliteSide | None,
    postgres: PostgresSide | None,
    decode: Callable[[Any], T],
    writes: bool = ...,
    first: bool = ...,
) -> Operation[T]: ...


@overload
def procedure(
    name: str,
    *,
    sqlite: SqliteSide | None,
    postgres: PostgresSide | None,
    decode: None = ...,
    writes: bool = ...,
    first: bool = ...,
) -> Operation[Any]: ...


def procedure(
    name: str,
    *,
    sqlite: SqliteSide | None,
    postgres: PostgresSide | None,
    decode: Callable[[Any], Any] | None = None,
    writes: bool = False,
    first: bool = False,
) -> Operation[Any]:
    """An operation written as one function per backend; ``decode`` (when given) turns its
    answer into the caller's.

    Use it for several statements in one transaction, SQL built to fit the arguments, or
    logic between statements; the functions may share :class:`Statement` objects. Either
    side may be None for an operation that runs on one backend only (calling it on the other
    is a ``TypeError``).
    """
    for side, what in ((sqlite, "sqlite"), (postgres, "postgres")):
        if side is not None and not callable(side):
            raise TypeError(f"operation {name!r}: {what} must be a function")
    return Operation(
        name, sqlite=sqlite, postgres=postgres, decode=decode, writes=writes, first=first
    )


#: A channel's name on the server, ``<channel>:<12 hex digits of md5(current_schema())>``: as
#: SQL of a text parameter (:func:`scoped_channel_sql`). Notifications are per database, not per
#: schema, so two deployments in two schemas of one database (``?search_path=``, as the suite's
#: tests are) heard each other's: a ``p <session>`` from one made the other's actor of a session
#: with the same id store its policy again, an ``x <session>`` (a delete request for the
#: holder) reached the other's holder of the same id. The server names the schema, so every node
#: on one schema agrees without being told; the hash keeps the name under PostgreSQL's 63 bytes
#: for any schema name.
CHANNEL_SUFFIX_SQL = "':' || left(md5(current_schema()), 12)"


def scoped_channel_sql(parameter: str) -> str:
    """SQL for the server-side name of the channel given as the text ``parameter`` (``$1``,
    ``:channel``): see :data:`CHANNEL_SUFFIX_SQL`."""
    return f"{parameter}::text || {CHANNEL_SUFFIX_SQL}"
