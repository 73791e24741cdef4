"""The background tasks' table: the execution feature's migration set ``"background"``.

====================  ==========================================================================
``background_tasks``  one background task (``background.py``), by its session and its id (ids are
                      short: unique within a session), written when it starts and when it
                      ends: its session (``session_key``) and that session's user (``owner``),
                      the tool and a bounded summary of its arguments, ``state`` (``running``,
                      then ``completed``, ``failed``, ``cancelled`` or ``lost``), its result once
                      it ended (bounded JSON), when it started and ended, and the node
                      incarnation that runs it (``node_id``, ``node_epoch``). A ``running`` row
                      whose incarnation is no longer live (its node stopped or was declared
                      dead, or started again with a newer epoch) is closed as ``lost`` once, by
                      whichever node sees it first; ``notified_at`` says its session was told
                      (set once the notice is stored, never with the end), and ``notice``
                      (migration 2) is the idempotency key of the notice that tells it: the
                      tasks that end within one batch window share one. An ended task whose
                      session was not told when its incarnation ended is told by the next
                      sweep, under that key, so a notice is stored once however often it is
                      tried.
                      At most ``KEEP_FINISHED`` finished rows are kept per session; a deleted
                      session's rows go with it.
====================  ==========================================================================

Any node reads a task from here when it does not hold it in memory, so a task's status and
result can be asked through any node. A set of its own (not a step of the feature's
``execution`` set, which holds the approvals), so the two tables grow independently.
"""

from __future__ import annotations

from turnstile.runtime.store import Migration, MigrationSet

__all__ = ["BACKGROUND", "TASK_STATES"]

#: What a stored task's ``state`` may be.
TASK_STATES = ("running", "completed", "failed", "cancelled", "lost")
_STATES_SQL = "(" + ", ".join(f"'{s}'" for s in TASK_STATES) + ")"


def _tables(time: str, node: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE background_tasks (
            session_key TEXT NOT NULL,
            id TEXT NOT NULL,
            owner TEXT NOT NULL,
            tool TEXT NOT NULL,
            args TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN {_STATES_SQL}),
            result TEXT,
            started_at {time} NOT NULL,
            finished_at {time},
            node_id {node} NOT NULL,
            node_epoch BIGINT NOT NULL,
            notified_at {time},
            PRIMARY KEY (session_key, id)
        )""",
        "CREATE INDEX background_tasks_session ON background_tasks (session_key, started_at)",
        # what every sweep reads: the incarnations running tasks, and the lost tasks not told
        "CREATE INDEX background_tasks_running ON background_tasks (node_id, node_epoch)"
        " WHERE state = 'running'",
        "CREATE INDEX background_tasks_untold ON background_tasks (finished_at)"
        " WHERE state = 'lost' AND notified_at IS NULL",
    )


#: Migration 2: a notice's key, and the sweeps read every ended task not told yet (before it,
#: a task's end set ``notified_at`` before its session was told: a crash between the two lost
#: the notice, issue 23's crash harness, scenario ``background``).
_TOLD = (
    "ALTER TABLE background_tasks ADD COLUMN notice TEXT",
    "DROP INDEX background_tasks_untold",
    "CREATE INDEX background_tasks_untold ON background_tasks (finished_at)"
    " WHERE state <> 'running' AND notified_at IS NULL",
)

#: The background tasks' migration set.
BACKGROUND = MigrationSet(
    "background",
    (
        Migration(
            1,
            "background tasks",
            sqlite=_tables("TEXT", "TEXT"),
            postgres=_tables("TIMESTAMPTZ", 'TEXT COLLATE "C"'),
        ),
        Migration(
            2,
            "background tasks told once",
            sqlite=_TOLD,
            postgres=_TOLD,
        ),
    ),
)
