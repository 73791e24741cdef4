"""The ``Store`` protocol: the durable truth of the runtime.

The store is the truth; memory is a cache. Every method is a trio-flavoured coroutine; every
write is durable (committed) when the call returns. One class implements it,
:class:`runtime.store.front.StoreFront`, which checks arguments and builds records over one of
two backends that run the queries: :mod:`runtime.store.sqlite` (embedded default) and
:mod:`runtime.store.postgres`.

Errors (all from :mod:`runtime.errors`):

* :class:`~runtime.errors.NotFound` - no row with that id (``no session with id 'x'``).
* :class:`~runtime.errors.AlreadyExists` - a row with that id exists.
* :class:`~runtime.errors.ConflictError` - an illegal state transition.
* :class:`~runtime.errors.MigrationError` - the schema could not be brought up to date.
* :class:`~runtime.errors.StoreError` - anything else the database reported.

Malformed arguments (a payload that is not a dict, an unknown state name) raise ``TypeError``
or ``ValueError`` before anything is written.

Optional arguments of the ``update_*`` methods default to :data:`UNSET` ("leave as is"), so
that ``None`` can mean "set to NULL" where a column is nullable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from msgspec import UNSET, UnsetType

from turnstile.runtime.clock import Clock
from turnstile.runtime.store.records import (
    ClusterView,
    Enqueued,
    EventRecord,
    FireRequest,
    FireResult,
    InboxItem,
    Job,
    JobRun,
    MigrationRecord,
    NodeRecord,
    NodeRef,
    Session,
    SessionLease,
    TakeOver,
)
from turnstile.runtime.store.tables import TableQuery

__all__ = ["Store", "UNSET", "UnsetType"]


@runtime_checkable
class Store(Protocol):
    """Sessions, their inboxes and event logs, and the scheduler's jobs and runs.

    Attributes:
        backend: ``"sqlite"`` or ``"postgres"``.
        clock: the clock whose wall time stamps every row.
        claimer: the node incarnation ``claim_next_input`` records as the claimer of what it
            claims; None (no node registered through this store) records none.
    """

    backend: str
    clock: Clock
    claimer: NodeRef | None

    # -- schema -------------------------------------------------------------------------------

    async def ping(self) -> None:
        """Round-trip a trivial query; raises when the database does not answer.

        Used by ``/healthz``.
        """
        ...

    def db_time(self, value: datetime) -> Any:
        """An aware datetime as this backend stores it (ISO text on SQLite, ``datetime`` on
        PostgreSQL), for arguments of a feature's own queries."""
        ...

    async def run_read(self, query: TableQuery, /, **args: Any) -> Any:
        """Run a feature's own read query (``runtime.store.tables``) for this backend."""
        ...

    async def run_write(self, query: TableQuery, /, **args: Any) -> Any:
        """Run a feature's own write query in one transaction; durable when this returns."""
        ...

    async def migrations(self) -> list[MigrationRecord]:
        """The applied schema migrations: the kernel's first, then each other set's by name.

        Returns:
            One record per row of ``schema_migrations``, by set and version.
        """
        ...

    # -- sessions -----------------------------------------------------------------------------

    async def create_session(
        self,
        id: str,
        owner: str,
        metadata: dict[str, Any] | None = None,
        policy: str = "enqueue",
    ) -> Session:
        """Create a session with an empty inbox and event log.

        Args:
            id: caller-supplied, non-empty.
            owner: the user it belongs to.
            metadata: free-form JSON object (default ``{}``).
            policy: what to do with input arriving mid-turn.

        Returns:
            The new session (``last_seq`` 0).

        Raises:
            AlreadyExists: ``session 'x' already exists``.
        """
        ...

    async def get_session(self, id: str) -> Session:
        """Read one session.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def list_sessions(
        self, owner: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Session]:
        """List sessions ordered by id (byte order), one page at a time.

        Args:
            owner: only this user's sessions; None for all.
            limit: at most this many (positive).
            after_id: keyset pagination - only ids greater than this one.

        Returns:
            Up to ``limit`` sessions; pass the last one's id as ``after_id`` for the next page.
        """
        ...

    async def update_session(
        self,
        id: str,
        *,
        metadata: dict[str, Any] | UnsetType = UNSET,
        policy: str | UnsetType = UNSET,
    ) -> Session:
        """Replace a session's metadata and/or policy; bumps ``updated_at`` when anything is set.

        Returns:
            The session as stored after the update.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def delete_session(self, id: str) -> None:
        """Delete a session with its inbox, events, jobs and their runs.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    # -- inbox --------------------------------------------------------------------------------

    async def enqueue_input(
        self, session_id: str, source: str, payload: dict[str, Any]
    ) -> InboxItem:
        """Append a turn input to a session's inbox, in state ``queued``.

        The input is durable when this returns: the return is the acknowledgement.

        Args:
            session_id: the session.
            source: where it came from (``"user"``, ``"cron"``, ...).
            payload: the input.

        Returns:
            The stored item, with its store-assigned monotonic id.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def enqueue_keyed(
        self,
        session_id: str,
        source: str,
        payload: dict[str, Any],
        idempotency_key: str,
        *,
        state: str = "queued",
        detail: dict[str, Any] | None = None,
    ) -> Enqueued:
        """Enqueue an input under an idempotency key, at most once per session and key.

        The key is unique per session in the database itself (a unique index): the insert does
        nothing when the key is taken, and the row that holds it is read back. So any number
        of concurrent calls with one key, on any number of nodes sharing a PostgreSQL, store
        one row; every call answers that row. The key lives as long as the row, which goes
        only with its session.

        Args:
            session_id, source, payload: as ``enqueue_input``.
            idempotency_key: 1 to 255 visible ASCII characters (``!`` to ``~``). Callers
                namespace their keys by where the input came from (``client:<id>``,
                ``github:<delivery id>``), since the space is shared per session.
            state: ``queued`` (to run), or ``done`` for an input that will not run as a turn
                of its own (one folded into the running turn) but whose key must be kept.
            detail: stored with the row (``done`` rows say why).

        Returns:
            The row under the key, and whether this call stored it.

        Raises:
            InvalidArgument: the key is malformed (``field`` is ``idempotency_key``).
            IdempotencyKeyReused: the key already names an input with another source or
                payload; nothing is written.
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def keyed_input(
        self, session_id: str, idempotency_key: str, *, source: str, payload: dict[str, Any]
    ) -> InboxItem | None:
        """The input enqueued under ``idempotency_key`` in the session, if any (a read only).

        Raises:
            InvalidArgument: the key is malformed.
            IdempotencyKeyReused: there is one, but with another source or payload.
        """
        ...

    async def claim_next_input(
        self, session_id: str, *, fence: int | None = None
    ) -> InboxItem | None:
        """Atomically move the oldest ``queued`` input of a session to ``running``.

        Concurrent callers (even on different store instances) never get the same item. The
        same statement records :attr:`claimer` on the row (``claimed_by``), so that recovery
        can tell whose turn it is. With ``fence`` (the lease epoch of the activation that
        claims, ``acquire_session``) the claim happens only while that is still the
        session's lease epoch, checked in the same statement.

        Returns:
            The claimed item (state ``running``), or None when nothing is queued.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def finish_input(
        self,
        input_id: int,
        state: str,
        detail: dict[str, Any] | None = None,
        *,
        fence: int | None = None,
    ) -> InboxItem:
        """Move a ``running`` input to ``done``, ``failed`` or ``interrupted``.

        Args:
            input_id: the item.
            state: one of :data:`~runtime.store.records.FINAL_INPUT_STATES`.
            detail: what to record with it (an error, a summary); replaces any earlier detail.

        Returns:
            The item as stored after the change.

        Raises:
            ValueError: ``state`` is not an input state at all.
            NotFound: ``no input with id 5``.
            ConflictError: the transition is illegal: ``cannot move input 5 from done to failed``.
            Fenced: ``fence`` was given and is no longer the session's lease epoch.
        """
        ...

    async def fold_input(
        self, input_id: int, detail: dict[str, Any] | None = None, *, fence: int | None = None
    ) -> InboxItem | None:
        """Move a ``queued`` input straight to ``done`` without a turn of its own: it was folded
        into the session's running turn (an ``inject`` message stored by another node).

        Args:
            input_id: the item.
            detail: replaces its detail (which turn it went into).
            fence: as ``claim_next_input``.

        Returns:
            The item as stored after the change, or None when it was no longer ``queued``
            (claimed meanwhile: it runs as a turn of its own) or does not exist.

        Raises:
            Fenced: ``fence`` was given and is no longer the session's lease epoch.
        """
        ...

    async def requeue_input(self, input_id: int, detail: dict[str, Any] | None = None) -> InboxItem:
        """Crash recovery that runs a cut-off turn again: move an ``interrupted`` input back
        to ``queued`` (the one way out of a final state). Its id keeps its place: it is the
        next of its session to run.

        Args:
            input_id: the item.
            detail: replaces its detail (recovery counts the re-runs there).

        Raises:
            NotFound: ``no input with id 5``.
            ConflictError: it is not interrupted: ``cannot move input 5 from done to queued``.
        """
        ...

    async def list_inputs(
        self, session_id: str, states: Sequence[str] | None = None
    ) -> list[InboxItem]:
        """A session's inbox in id (arrival) order, optionally only items in ``states``.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def interrupt_running(self) -> list[InboxItem]:
        """Crash recovery of a store that one process uses alone: move every ``running``
        input to ``interrupted``, whoever claimed it. A node that shares its store uses
        :meth:`take_over_dead_nodes` instead.

        Returns:
            The items changed, by id.
        """
        ...

    async def sessions_with_queued_inputs(self, *, node: NodeRef | None = None) -> list[str]:
        """Ids of the sessions that have at least one ``queued`` input, sorted (for recovery).

        Args:
            node: the node asking; given, the sessions with an input running on another live
                node (a current, not stopped epoch) are left out: that node goes on with
                their queue.
        """
        ...

    # -- nodes --------------------------------------------------------------------------------
    # Membership of the nodes sharing this store (runtime.membership drives these). Every lease
    # decision is taken by the database clock on PostgreSQL (now() in the statement) and by
    # the store's clock on SQLite, never by a node's own clock on PostgreSQL.

    async def register_node(
        self, id: str, *, lease_seconds: float, address: str | None = None
    ) -> tuple[NodeRecord, NodeRecord | None]:
        """Register a start of node ``id``: a new epoch (1, or one more than the row's), state
        ``running``, a lease of ``lease_seconds`` from now.

        An earlier epoch of the same id loses its row: its next heartbeat raises
        ``LeaseLost`` (so two processes given one id cannot both serve), and the inputs it
        had claimed are dead claims that recovery may take.

        Returns:
            The row as registered, and the row it replaced (None for a new id): whether that
            earlier epoch was still ``alive`` tells a restart from a takeover.

        Raises:
            InvalidArgument: a malformed id (``field`` is ``id``).
        """
        ...

    async def heartbeat_node(
        self, node: NodeRef, *, lease_seconds: float, address: str | None = None
    ) -> NodeRecord:
        """Renew ``node``'s lease to ``lease_seconds`` from now (and set its address when given).

        It renews only while ``node.epoch`` is its id's current epoch and the row is not
        ``stopped``; a lease that lapsed without anyone declaring the node dead is renewed
        (none of its work had moved).

        Raises:
            LeaseLost: the row belongs to a newer epoch, or the node was declared dead or
                stopped; the message says which. The node must stop serving.
        """
        ...

    async def drain_node(self, node: NodeRef) -> bool:
        """Mark ``node`` draining (a graceful stop has begun): still alive, so it keeps its
        leases and its running turns, but no longer given new work (``Membership.owns``).
        False unless that epoch was current and running."""
        ...

    async def stop_node(self, node: NodeRef) -> bool:
        """Mark ``node`` stopped (a clean shutdown): dead for everyone at once, so another node
        may take whatever it left running. False when that epoch was not current or already
        stopped."""
        ...

    async def list_nodes(self) -> ClusterView:
        """Every node's row by id, each judged alive or dead at one instant (the database's
        clock on PostgreSQL)."""
        ...

    async def take_over_dead_nodes(self, node: NodeRef, *, unclaimed: bool = False) -> TakeOver:
        """Recovery scoped to dead nodes, asked by the live ``node``, in one transaction.

        First every other node whose lease expired is declared dead (``stopped``: its
        heartbeat can no longer renew, so it stops serving). Then every ``running`` input
        whose claimer is no current, running epoch (a dead node's, a stopped one's, an
        earlier incarnation of any node's, ``node``'s own earlier ones) is moved to
        ``interrupted``; with ``unclaimed``, so are the running inputs that record no claimer
        (rows from before claimers were recorded, or claimed through a store with no node).
        The inputs of ``node`` itself and of every live node are left alone.
        """
        ...

    # -- session leases -----------------------------------------------------------------------

    async def acquire_session(self, session_id: str, node: NodeRef) -> SessionLease:
        """Make ``node`` the holder of ``session_id``'s lease, unless another live node holds it.

        Acquired (``fence`` set, one more than the session's previous lease epoch, even when
        ``node`` held it already, so that a late release of an earlier activation cannot
        clear it) when nobody holds the lease, when its holder is not live (its node's
        current epoch, not stopped, lease unexpired: by the database's clock on
        PostgreSQL), or when ``node`` holds it. Otherwise ``fence`` is None and ``holder``
        names the live node that holds it. The fenced writes (``claim_next_input``,
        ``finish_input``, ``append_events`` with ``fence=``) are ordered against it.

        Raises:
            NotFound: no such session.
        """
        ...

    async def release_session(self, session_id: str, fence: int) -> bool:
        """Give the lease up (the activation ended), if ``fence`` is still its epoch; the epoch
        stays, so the next holder gets a higher one. False when the lease had moved on."""
        ...

    # -- notifications ------------------------------------------------------------------------

    async def notify(self, channel: str, payload: str) -> None:
        """Tell every listener of ``channel`` (other nodes on PostgreSQL: ``pg_notify``; nobody
        on SQLite). A hint, not a delivery: a listener that was not connected misses it, so
        whatever it signals must also be found by looking at the rows.

        Raises:
            InvalidArgument: a malformed channel name, or a payload of 8000 bytes or more.
        """
        ...

    async def listen(self, channel: str, on_message: Callable[[str | None], None]) -> None:
        """Call ``on_message(payload)`` for every notification on ``channel``, forever (cancel
        to stop), and ``on_message(None)`` after every (re)connection, when notifications may
        have been missed. PostgreSQL listens on a connection of its own, checked and replaced
        when it is lost; SQLite calls ``on_message(None)`` once and nothing more."""
        ...

    # -- events -------------------------------------------------------------------------------

    async def append_events(
        self,
        session_id: str,
        events: Sequence[tuple[str, dict[str, Any]]],
        *,
        fence: int | None = None,
    ) -> list[EventRecord]:
        """Atomically append events to a session's log.

        Seqs are consecutive, gap-free and strictly increasing per session, however many
        appenders (tasks, processes, store instances) run at once. With ``fence``, only while
        it is the session's lease epoch (as ``claim_next_input``); else ``Fenced``.

        Args:
            session_id: the session.
            events: ``(type, payload)`` pairs; an empty sequence is a no-op.

        Returns:
            The stored events, with their seqs, in the given order.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def read_events(
        self, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        """Events with ``seq > after_seq``, ordered by seq, at most ``limit`` of them.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def read_events_back(
        self,
        session_id: str,
        types: Sequence[str],
        before_seq: int | None = None,
        limit: int = 1000,
    ) -> list[EventRecord]:
        """The newest events whose type is one of ``types``, with ``seq < before_seq`` (all
        when None), newest first, at most ``limit`` of them: the end of a long log without
        reading all of it (a session's transcript, ``actors.sessions.history``).

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's last event, 0 when its log is empty.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        ...

    # -- jobs ---------------------------------------------------------------------------------

    async def create_job(
        self,
        id: str,
        *,
        kind: str,
        spec: dict[str, Any],
        session_id: str | None = None,
        next_fire_at: datetime | None = None,
        state: str = "active",
    ) -> Job:
        """Create a job (``run_count`` 0).

        Args:
            id: caller-supplied, non-empty.
            kind: the kind of schedule; not interpreted by the store.
            spec: the schedule and what to deliver.
            session_id: the session its turns go to, or None.
            next_fire_at: the first occurrence, or None.
            state: one of :data:`~runtime.store.records.JOB_STATES`.

        Raises:
            AlreadyExists: ``job 'x' already exists``.
            NotFound: ``no session with id 'x'``.
        """
        ...

    async def get_job(self, id: str) -> Job:
        """Read one job.

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        ...

    async def list_jobs(
        self, session_id: str | None = None, states: Sequence[str] | None = None
    ) -> list[Job]:
        """Jobs ordered by (created_at, id), optionally of one session and/or in ``states``."""
        ...

    async def update_job(
        self,
        id: str,
        *,
        kind: str | UnsetType = UNSET,
        spec: dict[str, Any] | UnsetType = UNSET,
        state: str | UnsetType = UNSET,
        next_fire_at: datetime | None | UnsetType = UNSET,
    ) -> Job:
        """Change a job's fields; bumps ``updated_at`` when anything is set.

        This is a plain write, not a compare-and-set: to consume an occurrence use
        :meth:`fire_job`.

        Returns:
            The job as stored after the update.

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        ...

    async def delete_job(self, id: str) -> None:
        """Delete a job and its runs (inbox items it enqueued stay).

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        ...

    async def due_jobs(self, before: datetime, limit: int = 100) -> list[Job]:
        """Active jobs with ``next_fire_at <= before``, ordered by (next_fire_at, id)."""
        ...

    async def list_runs(self, job_id: str, limit: int = 100) -> list[JobRun]:
        """A job's runs, newest first, at most ``limit``.

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        ...

    async def get_run(self, run_id: int) -> JobRun:
        """One run by its id.

        Raises:
            NotFound: ``no run with id 5``.
        """
        ...

    async def update_run(
        self, run_id: int, state: str, detail: dict[str, Any] | None = None
    ) -> JobRun:
        """Set a run's state (any non-empty string, e.g. ``"turn_completed"``).

        Args:
            run_id: the run.
            state: the new state.
            detail: the new detail; None leaves the current detail as it is.

        Raises:
            NotFound: ``no run with id 5``.
        """
        ...

    async def fire_job(
        self,
        job_id: str,
        expected_next_fire_at: datetime,
        new_next_fire_at: datetime | None,
        run_state: str = "queued",
        input: tuple[str, dict[str, Any]] | None = None,
        detail: dict[str, Any] | None = None,
        counts: bool = True,
        extra_runs: Sequence[tuple[datetime, str, dict[str, Any] | None]] = (),
    ) -> FireResult | None:
        """Consume one occurrence of a job, exactly once, in one transaction.

        Compare-and-set: only when the job is ``active`` and its ``next_fire_at`` equals
        ``expected_next_fire_at``, the store advances ``next_fire_at`` to ``new_next_fire_at``
        (None also moves the job to ``completed``), increments ``run_count``, records a run for
        the occurrence (``scheduled_for = expected_next_fire_at``) and, when ``input`` is
        given, enqueues it in the job's session inbox and links it to the run. The input's
        payload gets the run's id as ``run_id``: its turn settles that run by id, however many
        runs (coalesced or missed occurrences) the same fire recorded after it.

        Args:
            job_id: the job.
            expected_next_fire_at: the occurrence being fired, as read from the job.
            new_next_fire_at: the following occurrence, or None when there is none.
            run_state: the state of the new run.
            input: ``(source, payload)`` of the turn input to enqueue, or None.
            detail: the new run's detail, or None.
            counts: whether the occurrence counts towards ``run_count`` (a skipped, missed
                occurrence does not).
            extra_runs: more run records to write in the same transaction, as
                ``(scheduled_for, state, detail)`` — the occurrences a misfire policy
                coalesced or skipped.

        Returns:
            What was written, or None when the compare-and-set lost (the job was fired,
            changed, paused or completed by someone else).

        Raises:
            NotFound: ``no job with id 'x'``.
            ConflictError: ``input`` was given but the job has no session.
        """
        ...

    async def fire_jobs(self, fires: Sequence[FireRequest]) -> list[FireResult | None]:
        """Fire many on-time occurrences at once, each exactly once, as :meth:`fire_job` fires
        one that delivers a turn (with an input, counted, no extra runs).

        Each occurrence is its own compare-and-set: one that loses writes nothing and does not
        stop the others. On PostgreSQL the batch is one statement (one round trip); a batch
        racing another node's over the same jobs fires each occurrence once in total (the row
        lock makes the second writer re-check the condition, as for ``fire_job``).

        Args:
            fires: the occurrences, at most one per job.

        Returns:
            One answer per request, in order: what ``fire_job`` would return, or None when this
            call did not fire it: the compare-and-set lost (fired, changed, paused, cancelled
            or completed by someone else), or the job does not exist or has no session.
            ``fire_job`` with the same arguments tells those apart (None, ``NotFound``,
            ``ConflictError``).

        Raises:
            ValueError: the same job twice.
        """
        ...

    # -- key-value ------------------------------------------------------------------------------

    async def kv_put(
        self,
        namespace: str,
        items: Sequence[tuple[str, dict[str, Any], datetime | None]],
    ) -> None:
        """Insert or replace ``(key, value, expires_at)`` items of ``namespace``, in one commit.

        For small state that belongs to no table of its own (watchers, notification buffers):
        ``value`` is a JSON object; an item whose ``expires_at`` has passed reads as absent.
        """
        ...

    async def kv_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        """The value under ``key``, or None (missing or expired)."""
        ...

    async def kv_delete(self, namespace: str, keys: Sequence[str]) -> int:
        """Delete ``keys`` of ``namespace``; returns how many existed."""
        ...

    async def kv_list(
        self, namespace: str, *, after_key: str | None = None, limit: int = 1000
    ) -> list[tuple[str, dict[str, Any]]]:
        """Unexpired ``(key, value)`` pairs of ``namespace`` in key order, after ``after_key``."""
        ...

    async def kv_purge_expired(self) -> int:
        """Delete every expired item; returns how many."""
        ...

    async def kv_append(
        self,
        namespace: str,
        value: dict[str, Any],
        *,
        expires_at: datetime | None = None,
        keep: int | None = None,
    ) -> int:
        """Append ``value`` to ``namespace`` under the next number, in one transaction.

        Numbers are 1, 2, 3, … per namespace, without a gap or a repeat however many writers
        (nodes) append at once: a counter row (key ``""``, which ``kv_list`` never returns)
        is incremented and locked by the transaction that stores the item. The item's key is
        the number, zero-padded to 20 digits, so key order is number order. With ``keep``,
        only the newest ``keep`` items stay (the oldest are deleted in the same transaction);
        a reader tells what was dropped or expired from the gaps between the numbers it sees
        and the counter (``kv_get(namespace, "")`` is ``{"seq": <last number>}``).

        Returns:
            The item's number.
        """
        ...
