"""The migration runner: ordered, named sets of versioned migrations.

A :class:`MigrationSet` is one owner's schema history: the kernel's (``"kernel"``, see
:mod:`runtime.store.kernel`) and any set a caller passes to ``open_store(url,
migrations=[...])``, so that a feature's tables can be added later without touching the
kernel's. Each applied step is one row of ``schema_migrations(set_name, version, name,
applied_at)``, keyed by ``(set_name, version)``.

Rules:

* Within a set, versions start at 1 and are consecutive.
* A migration is a tuple of single SQL statements (no ``executescript``: it would commit),
  either the same for every backend (``statements``) or one tuple per backend (``sqlite=``,
  ``postgres=``; a backend without its own tuple runs ``statements``).
* At start-up the backend runs every pending step of every set, kernel first and then the
  caller's sets in the order given, all in one transaction; running them again changes nothing.
* A set whose highest recorded version is newer than the code's, or a recorded step whose name
  differs from the code's, is refused with :class:`~runtime.errors.MigrationError` rather
  than touched. Sets recorded in the database but not passed in are left alone.
* Never edit a released migration: add a new one.

Databases written before sets existed have ``schema_migrations(version, name, applied_at)``;
the backends upgrade that table in place (its rows become the kernel's) before anything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from turnstile.runtime.errors import MigrationError

__all__ = [
    "KERNEL_SET",
    "Migration",
    "MigrationSet",
    "Step",
    "ordered_sets",
    "plan",
]

#: The name of the kernel's set; a caller's set may not take it.
KERNEL_SET = "kernel"
_DIALECTS = ("sqlite", "postgres")


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned step of a set.

    Args:
        version: 1 for the first step of a set, then consecutive.
        name: a short identifier, recorded with the version.
        statements: the SQL statements for every backend without a tuple of its own.
        sqlite: SQLite's own statements, when they differ.
        postgres: PostgreSQL's own statements, when they differ.
    """

    version: int
    name: str
    statements: tuple[str, ...] = ()
    sqlite: tuple[str, ...] | None = None
    postgres: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"migration version must be a positive int, not {self.version!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("migration name must be a non-empty str")
        for attr in ("statements", *_DIALECTS):
            value = getattr(self, attr)
            if isinstance(value, str):
                raise TypeError(f"migration {attr} must be a sequence of str, not a str")
            if value is not None:
                object.__setattr__(self, attr, tuple(value))

    def statements_for(self, dialect: str) -> tuple[str, ...]:
        """What ``dialect`` (``"sqlite"`` or ``"postgres"``) runs for this step."""
        own = getattr(self, dialect)
        return self.statements if own is None else own


@dataclass(frozen=True, slots=True)
class MigrationSet:
    """A named, ordered list of migrations (versions 1, 2, ... in order).

    Args:
        name: what the set is recorded under (``"kernel"`` is the store's own).
        migrations: its steps, oldest first.
    """

    name: str
    migrations: tuple[Migration, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("migration set name must be a non-empty str")
        steps = tuple(self.migrations)
        for expected, m in enumerate(steps, start=1):
            if not isinstance(m, Migration):
                raise TypeError(f"migration set {self.name!r} holds a {type(m).__name__}")
            if m.version != expected:
                raise ValueError(
                    f"migration set {self.name!r}: versions must be consecutive from 1"
                    f" (found {m.version} at position {expected})"
                )
        object.__setattr__(self, "migrations", steps)

    @property
    def version(self) -> int:
        """The latest version of the set (0 when it is empty)."""
        return len(self.migrations)


@dataclass(frozen=True, slots=True)
class Step:
    """One pending migration of one set, with the statements of the backend that runs it."""

    set_name: str
    version: int
    name: str
    statements: tuple[str, ...]


def ordered_sets(kernel: MigrationSet, extra: Iterable[MigrationSet]) -> tuple[MigrationSet, ...]:
    """``kernel`` then the caller's sets, checked: each a MigrationSet, no name twice."""
    if isinstance(extra, MigrationSet):
        raise TypeError("migrations must be a sequence of MigrationSet, not one MigrationSet")
    sets = (kernel, *extra)
    seen: set[str] = set()
    for s in sets:
        if not isinstance(s, MigrationSet):
            raise TypeError(f"migrations must hold MigrationSet, not {type(s).__name__}")
        if s.name in seen:
            raise ValueError(f"migration set {s.name!r} given twice")
        seen.add(s.name)
    return sets


def plan(
    applied: Iterable[tuple[str, int, str]], sets: Sequence[MigrationSet], dialect: str
) -> list[Step]:
    """The steps still to run, in order, given the ``(set_name, version, name)`` rows recorded.

    Raises:
        MigrationError: a set's recorded version is newer than the code's, or a recorded
            step's name is not the code's.
    """
    recorded: dict[str, dict[int, str]] = {}
    for set_name, version, name in applied:
        recorded.setdefault(set_name, {})[version] = name
    steps: list[Step] = []
    for s in sets:
        done = recorded.get(s.name, {})
        if done and max(done) > s.version:
            where = "" if s.name == KERNEL_SET else f" of set {s.name!r}"
            raise MigrationError(
                f"schema version {max(done)}{where} is newer than this code ({s.version})"
            )
        for m in s.migrations:
            if m.version not in done:
                steps.append(Step(s.name, m.version, m.name, m.statements_for(dialect)))
            elif done[m.version] != m.name:
                raise MigrationError(
                    f"migration {s.name} {m.version} is recorded as {done[m.version]!r},"
                    f" but this code calls it {m.name!r}"
                )
    return steps


# -- the table that records them, per backend ------------------------------------------------

SQLITE_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    set_name TEXT NOT NULL DEFAULT 'kernel',
    version INTEGER NOT NULL,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL,
    PRIMARY KEY (set_name, version)
) STRICT
"""

#: A pre-sets table (``version`` alone was the key) becomes the kernel's rows of a new one.
SQLITE_SCHEMA_TABLE_UPGRADE = (
    "ALTER TABLE schema_migrations RENAME TO schema_migrations_before_sets",
    SQLITE_SCHEMA_TABLE,
    "INSERT INTO schema_migrations (set_name, version, name, applied_at)"
    " SELECT 'kernel', version, name, applied_at FROM schema_migrations_before_sets",
    "DROP TABLE schema_migrations_before_sets",
)

POSTGRES_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    set_name text COLLATE "C" NOT NULL DEFAULT 'kernel',
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamptz NOT NULL,
    PRIMARY KEY (set_name, version)
)
"""

POSTGRES_SCHEMA_TABLE_UPGRADE = (
    'ALTER TABLE schema_migrations ADD COLUMN set_name text COLLATE "C" NOT NULL'
    " DEFAULT 'kernel'",
    "ALTER TABLE schema_migrations DROP CONSTRAINT schema_migrations_pkey",
    "ALTER TABLE schema_migrations ADD PRIMARY KEY (set_name, version)",
)
