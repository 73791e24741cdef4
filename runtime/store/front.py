"""The validating front of the store: one implementation of :class:`~runtime.store.base.Store`.

Every public method checks its arguments here, once (the typed errors and messages of
:mod:`runtime.store._util`), encodes JSON and times, asks the backend (see
:mod:`runtime.store.backend`) to run the queries, and turns the rows it answers into records.
The backends only run queries. :func:`runtime.store.open_store` hands out a front.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from msgspec import UNSET, UnsetType

from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import (
    AlreadyExists,
    IdempotencyKeyReused,
    InvalidArgument,
    LeaseLost,
)
from turnstile.runtime.store import _util as u
from turnstile.runtime.store.backend import Backend
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

__all__ = ["StoreFront"]


# -- rows to records (a row reads row["column"]; times are ISO text or datetimes) --------------


def _ts(value: str | datetime) -> datetime:
    return u.parse_ts(value) if isinstance(value, str) else value


def _optional_ts(value: str | datetime | None) -> datetime | None:
    return None if value is None else _ts(value)


#: PostgreSQL refuses a NOTIFY payload of 8000 bytes or more
_MAX_NOTIFY_BYTES = 7999
#: How many event types ``read_events_back`` takes at once
MAX_EVENT_TYPES = 16
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _check_channel(channel: str) -> None:
    if not isinstance(channel, str) or not _CHANNEL.fullmatch(channel):
        raise InvalidArgument(
            "channel must be 1-63 lower-case letters, digits or _, not starting with a digit",
            field="channel",
        )


def _fence(fence: int | None) -> dict[str, int]:
    """The ``fence`` argument of a fenced write (none at all when unfenced: the backends'
    unfenced statements are the ones single-node stores run)."""
    if fence is None:
        return {}
    u.check_int(fence, "fence")
    return {"fence": fence}


def _session(row: Any) -> Session:
    return Session(
        id=row["id"],
        owner=row["owner"],
        metadata=u.decode_json(row["metadata"]),
        policy=row["policy"],
        created_at=_ts(row["created_at"]),
        updated_at=_ts(row["updated_at"]),
        last_seq=row["last_seq"],
    )


def _input(row: Any) -> InboxItem:
    return InboxItem(
        id=row["id"],
        session_id=row["session_id"],
        source=row["source"],
        payload=u.decode_json(row["payload"]),
        state=row["state"],
        created_at=_ts(row["created_at"]),
        updated_at=_ts(row["updated_at"]),
        detail=u.decode_optional_json(row["detail"]),
        idempotency_key=row["idempotency_key"],
        claimed_by=None
        if row["claimed_by"] is None
        else NodeRef(row["claimed_by"], row["claimed_epoch"]),
    )


def _node(row: Any) -> NodeRecord:
    return NodeRecord(
        id=row["id"],
        epoch=row["epoch"],
        state=row["state"],
        address=row["address"],
        started_at=_ts(row["started_at"]),
        heartbeat_at=_ts(row["heartbeat_at"]),
        lease_expires_at=_ts(row["lease_expires_at"]),
        alive=bool(row["alive"]),
    )


#: The states ``enqueue_keyed`` may store an input in: to run, or already settled (an input
#: folded into a running turn keeps its key in a row that never runs).
_KEYED_STATES = ("queued", "done")


def _same_input(item: InboxItem, source: str, payload: str) -> None:
    """Raise ``IdempotencyKeyReused`` unless ``item`` is the input ``(source, payload)``."""
    if item.source != source or item.payload != u.decode_json(payload):
        raise IdempotencyKeyReused(
            f"idempotency key {item.idempotency_key!r} already names another input of this"
            f" session (input {item.id}); a retry must send the same input"
        )


def _event(row: Any) -> EventRecord:
    return EventRecord(
        session_id=row["session_id"],
        seq=row["seq"],
        type=row["type"],
        payload=u.decode_json(row["payload"]),
        ts=_ts(row["ts"]),
    )


def _job(row: Any) -> Job:
    return Job(
        id=row["id"],
        session_id=row["session_id"],
        kind=row["kind"],
        spec=u.decode_json(row["spec"]),
        state=row["state"],
        next_fire_at=_optional_ts(row["next_fire_at"]),
        created_at=_ts(row["created_at"]),
        updated_at=_ts(row["updated_at"]),
        run_count=row["run_count"],
    )


def _run(row: Any) -> JobRun:
    return JobRun(
        id=row["id"],
        job_id=row["job_id"],
        scheduled_for=_ts(row["scheduled_for"]),
        state=row["state"],
        input_id=row["input_id"],
        detail=u.decode_optional_json(row["detail"]),
        created_at=_ts(row["created_at"]),
        updated_at=_ts(row["updated_at"]),
    )


def _migration(row: Any) -> MigrationRecord:
    return MigrationRecord(
        version=row["version"],
        name=row["name"],
        applied_at=_ts(row["applied_at"]),
        set_name=row["set_name"],
    )


def _lease_lost(node: NodeRef, current: NodeRecord | None) -> LeaseLost:
    """Why ``node``'s heartbeat could not renew its lease, as the error that says so."""
    who = f"node {node.id!r} epoch {node.epoch}"
    if current is None:
        reason = f"{who}: its row is gone from the nodes table"
    elif current.epoch != node.epoch:
        reason = (
            f"{who} was taken over by epoch {current.epoch} (another process started with"
            " this node id)"
        )
    else:
        reason = (
            f"{who} was declared dead (state stopped; its lease expired at"
            f" {current.lease_expires_at.isoformat()}), and its work moved to other nodes"
        )
    return LeaseLost(reason, node=node.id, epoch=node.epoch)


# -- the front --------------------------------------------------------------------------------


class StoreFront:
    """The store: checks arguments, then has ``engine`` run the queries.

    Args:
        engine: the backend (:class:`~runtime.store.backend.Backend`) that runs the queries.
        clock: its wall time stamps every row.

    Attributes:
        backend: ``"sqlite"`` or ``"postgres"``.
        clock: the clock.
        engine: the backend object.
        claimer: the node incarnation that ``claim_next_input`` stamps on what it claims
            (set by ``runtime.membership`` once the node registered), or None.
    """

    def __init__(self, engine: Backend, clock: Clock) -> None:
        self.engine = engine
        self.backend = engine.kind
        self.clock = clock
        self.claimer: NodeRef | None = None

    def __repr__(self) -> str:
        return f"<Store {self.engine!r}>"

    async def aclose(self) -> None:
        """Finish what is in flight and close the backend; later calls raise StoreError."""
        await self.engine.aclose()

    @property
    def commit_stats(self) -> tuple[int, int]:
        """SQLite only: (transactions committed, requests they held) by its group commit.

        Raises:
            AttributeError: the backend has no group commit (PostgreSQL).
        """
        return self.engine.commit_stats  # type: ignore[attr-defined]

    def _now(self) -> Any:
        return self.engine.db_time(self.clock.now())

    def _time(self, value: object, what: str) -> Any:
        return self.engine.db_time(u.check_time(value, what))

    def _optional_time(self, value: object, what: str) -> Any:
        return None if value is None else self._time(value, what)

    def db_time(self, value: datetime) -> Any:
        """An aware datetime as this backend stores it (for a feature's own queries)."""
        return self.engine.db_time(u.check_time(value, "time"))

    # ---- a feature's own tables (runtime.store.tables) ----

    async def run_read(self, query: TableQuery, /, **args: Any) -> Any:
        """Run ``query``'s read for this backend; its answer is returned as it is."""
        return await self.engine.run_read(self._dialect_fn(query), **args)

    async def run_write(self, query: TableQuery, /, **args: Any) -> Any:
        """Run ``query``'s write for this backend in one transaction; durable on return."""
        return await self.engine.run_write(self._dialect_fn(query), **args)

    def _dialect_fn(self, query: TableQuery) -> Any:
        if not isinstance(query, TableQuery):
            raise TypeError(f"expected a TableQuery, got {type(query).__name__}")
        return query.sqlite if self.backend == "sqlite" else query.postgres

    # ---- schema ----

    async def ping(self) -> None:
        await self.engine.read("ping")

    async def migrations(self) -> list[MigrationRecord]:
        return [_migration(r) for r in await self.engine.read("migrations")]

    # ---- sessions ----

    async def create_session(
        self,
        id: str,
        owner: str,
        metadata: dict[str, Any] | None = None,
        policy: str = "enqueue",
    ) -> Session:
        u.check_text(id, "id")
        u.check_text(owner, "owner")
        u.check_text(policy, "policy")
        meta = u.encode_json({} if metadata is None else metadata, "metadata")
        row = await self.engine.write(
            "create_session", id=id, owner=owner, metadata=meta, policy=policy, now=self._now()
        )
        if row is None:
            raise AlreadyExists(f"session {id!r} already exists")
        return _session(row)

    async def get_session(self, id: str) -> Session:
        row = await self.engine.read("get_session", id=id)
        if row is None:
            raise u.no_session(id)
        return _session(row)

    async def list_sessions(
        self, owner: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Session]:
        u.check_limit(limit)
        rows = await self.engine.read("list_sessions", owner=owner, limit=limit, after_id=after_id)
        return [_session(r) for r in rows]

    async def update_session(
        self,
        id: str,
        *,
        metadata: dict[str, Any] | UnsetType = UNSET,
        policy: str | UnsetType = UNSET,
    ) -> Session:
        sets: dict[str, Any] = {}
        if metadata is not UNSET:
            sets["metadata"] = u.encode_json(metadata, "metadata")  # type: ignore[arg-type]
        if policy is not UNSET:
            sets["policy"] = u.check_text(policy, "policy")
        if not sets:
            return await self.get_session(id)
        row = await self.engine.write("update_session", id=id, sets=sets, now=self._now())
        if row is None:
            raise u.no_session(id)
        return _session(row)

    async def delete_session(self, id: str) -> None:
        if not await self.engine.write("delete_session", id=id):
            raise u.no_session(id)

    # ---- inbox ----

    async def enqueue_input(
        self, session_id: str, source: str, payload: dict[str, Any]
    ) -> InboxItem:
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        data = u.encode_json(payload)
        row = await self.engine.write(
            "enqueue_input", session_id=session_id, source=source, payload=data, now=self._now()
        )
        if row is None:
            raise u.no_session(session_id)
        return _input(row)

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
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        key = u.check_idempotency_key(idempotency_key)
        if state not in _KEYED_STATES:
            raise ValueError(f"a keyed input is stored queued or done, not {state!r}")
        data = u.encode_json(payload)
        found = await self.engine.write(
            "enqueue_keyed",
            session_id=session_id,
            source=source,
            payload=data,
            key=key,
            state=state,
            detail=u.encode_optional_json(detail),
            now=self._now(),
        )
        if found is None:
            raise u.no_session(session_id)
        row, created = found
        item = _input(row)
        if not created:
            _same_input(item, source, data)
        return Enqueued(item=item, created=created)

    async def keyed_input(
        self, session_id: str, idempotency_key: str, *, source: str, payload: dict[str, Any]
    ) -> InboxItem | None:
        key = u.check_idempotency_key(idempotency_key)
        row = await self.engine.read("keyed_input", session_id=session_id, key=key)
        if row is None:
            return None
        item = _input(row)
        _same_input(item, source, u.encode_json(payload))
        return item

    async def claim_next_input(
        self, session_id: str, *, fence: int | None = None
    ) -> InboxItem | None:
        claimer = self.claimer
        row = await self.engine.write(
            "claim_next_input",
            session_id=session_id,
            now=self._now(),
            node=None if claimer is None else claimer.id,
            epoch=None if claimer is None else claimer.epoch,
            **_fence(fence),
        )
        return None if row is None else _input(row)

    async def finish_input(
        self,
        input_id: int,
        state: str,
        detail: dict[str, Any] | None = None,
        *,
        fence: int | None = None,
    ) -> InboxItem:
        u.check_int(input_id, "input_id")
        u.check_input_state(state)
        data = u.encode_optional_json(detail)
        fenced = _fence(fence)
        while True:
            if u.finish_allowed("running", state):
                row = await self.engine.write(
                    "finish_input",
                    input_id=input_id,
                    state=state,
                    detail=data,
                    now=self._now(),
                    **fenced,
                )
                if row is not None:
                    return _input(row)
            current = await self.engine.read("input_state", input_id=input_id)
            if current is None:
                raise u.no_input(input_id)
            if current != "running" or not u.finish_allowed(current, state):
                raise u.transition_error(input_id, current, state)
            # it was claimed between the two statements: try the move again

    async def fold_input(
        self, input_id: int, detail: dict[str, Any] | None = None, *, fence: int | None = None
    ) -> InboxItem | None:
        u.check_int(input_id, "input_id")
        row = await self.engine.write(
            "fold_input",
            input_id=input_id,
            detail=u.encode_optional_json(detail),
            now=self._now(),
            **_fence(fence),
        )
        return None if row is None else _input(row)

    async def requeue_input(self, input_id: int, detail: dict[str, Any] | None = None) -> InboxItem:
        u.check_int(input_id, "input_id")
        data = u.encode_optional_json(detail)
        row = await self.engine.write(
            "requeue_input", input_id=input_id, detail=data, now=self._now()
        )
        if row is not None:
            return _input(row)
        current = await self.engine.read("input_state", input_id=input_id)
        if current is None:
            raise u.no_input(input_id)
        raise u.transition_error(input_id, current, "queued")

    async def list_inputs(
        self, session_id: str, states: Sequence[str] | None = None
    ) -> list[InboxItem]:
        wanted = u.check_input_states(states)
        rows = await self.engine.read("list_inputs", session_id=session_id, states=wanted)
        return [_input(r) for r in rows]

    async def interrupt_running(self) -> list[InboxItem]:
        rows = await self.engine.write("interrupt_running", now=self._now())
        return sorted((_input(r) for r in rows), key=lambda item: item.id)

    async def sessions_with_queued_inputs(self, *, node: NodeRef | None = None) -> list[str]:
        if node is None:
            rows = await self.engine.read("sessions_with_queued_inputs")
        else:
            rows = await self.engine.read(
                "sessions_with_queued_inputs", node=node.id, epoch=node.epoch
            )
        return [r[0] for r in rows]

    # ---- nodes ----

    def _lease(self, lease_seconds: object) -> dict[str, Any]:
        """The lease arguments: its length, and (for SQLite) now and its end by our clock."""
        if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float):
            raise TypeError(f"lease_seconds must be a number, not {type(lease_seconds).__name__}")
        if not 0 < lease_seconds <= u.MAX_LEASE_SECONDS:
            raise ValueError(f"lease_seconds must be in (0, {u.MAX_LEASE_SECONDS}]")
        now = self.clock.now()
        return {
            "lease": float(lease_seconds),
            "now": self.engine.db_time(now),
            "expires": self.engine.db_time(now + timedelta(seconds=lease_seconds)),
        }

    async def register_node(
        self, id: str, *, lease_seconds: float, address: str | None = None
    ) -> tuple[NodeRecord, NodeRecord | None]:
        u.check_node_id(id)
        if address is not None:
            u.check_text(address, "address")
        lease = self._lease(lease_seconds)
        row, previous = await self.engine.write("register_node", id=id, address=address, **lease)
        return _node(row), None if previous is None else _node(previous)

    async def heartbeat_node(
        self, node: NodeRef, *, lease_seconds: float, address: str | None = None
    ) -> NodeRecord:
        if address is not None:
            u.check_text(address, "address")
        lease = self._lease(lease_seconds)
        row = await self.engine.write(
            "heartbeat_node", id=node.id, epoch=node.epoch, address=address, **lease
        )
        if row is not None:
            return _node(row)
        current = await self.engine.read("get_node", id=node.id, now=self._now())
        raise _lease_lost(node, None if current is None else _node(current))

    async def drain_node(self, node: NodeRef) -> bool:
        return await self.engine.write("drain_node", id=node.id, epoch=node.epoch)

    async def stop_node(self, node: NodeRef) -> bool:
        return await self.engine.write("stop_node", id=node.id, epoch=node.epoch, now=self._now())

    async def list_nodes(self) -> ClusterView:
        now, rows = await self.engine.read("list_nodes", now=self._now())
        return ClusterView(now=_ts(now), nodes=[_node(r) for r in rows])

    async def take_over_dead_nodes(self, node: NodeRef, *, unclaimed: bool = False) -> TakeOver:
        dead, items, leases = await self.engine.write(
            "take_over_dead_nodes",
            node=node.id,
            epoch=node.epoch,
            unclaimed=bool(unclaimed),
            now=self._now(),
        )
        return TakeOver(
            nodes=[_node(r) for r in dead],
            inputs=sorted((_input(r) for r in items), key=lambda item: item.id),
            leases={r["id"]: r["lease_epoch"] for r in leases},
        )

    # ---- session leases ----

    async def acquire_session(self, session_id: str, node: NodeRef) -> SessionLease:
        u.check_text(session_id, "session_id")
        row, current_row, cut_off = await self.engine.write(
            "acquire_session",
            session_id=session_id,
            node=node.id,
            epoch=node.epoch,
            now=self._now(),
        )
        if current_row is None:
            raise u.no_session(session_id)
        return SessionLease(
            session_id=session_id,
            fence=None if row is None else row["lease_epoch"],
            holder=current_row["lease_node"],
            holder_epoch=current_row["lease_node_epoch"],
            holder_address=current_row["address"],
            holder_live=bool(current_row["live"]),
            interrupted=sorted((_input(r) for r in cut_off), key=lambda item: item.id),
        )

    async def release_session(self, session_id: str, fence: int) -> bool:
        u.check_int(fence, "fence")
        return await self.engine.write("release_session", session_id=session_id, fence=fence)

    # ---- notifications ----

    async def notify(self, channel: str, payload: str) -> None:
        _check_channel(channel)
        u.check_text(payload, "payload")
        if len(payload.encode()) > _MAX_NOTIFY_BYTES:
            raise InvalidArgument(
                f"payload is longer than {_MAX_NOTIFY_BYTES} bytes", field="payload"
            )
        await self.engine.notify(channel, payload)

    async def listen(self, channel: str, on_message: Callable[[str | None], None]) -> None:
        _check_channel(channel)
        await self.engine.listen(channel, on_message)

    # ---- events ----

    async def append_events(
        self,
        session_id: str,
        events: Sequence[tuple[str, dict[str, Any]]],
        *,
        fence: int | None = None,
    ) -> list[EventRecord]:
        encoded = u.check_events(events)
        if not encoded:
            await self.last_seq(session_id)  # still NotFound for an unknown session
            return []
        now = self._now()
        last = await self.engine.write(
            "append_events", session_id=session_id, events=encoded, now=now, **_fence(fence)
        )
        if last is None:
            raise u.no_session(session_id)
        first, ts = last - len(encoded) + 1, _ts(now)
        return [
            EventRecord(
                session_id=session_id, seq=first + i, type=t, payload=u.decode_json(p), ts=ts
            )
            for i, (t, p) in enumerate(encoded)
        ]

    async def read_events(
        self, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        u.check_int(after_seq, "after_seq")
        u.check_limit(limit)
        rows = await self.engine.read(
            "read_events", session_id=session_id, after_seq=after_seq, limit=limit
        )
        return [_event(r) for r in rows]

    async def read_events_back(
        self,
        session_id: str,
        types: Sequence[str],
        before_seq: int | None = None,
        limit: int = 1000,
    ) -> list[EventRecord]:
        wanted = [u.check_text(t, "type") for t in types]
        if not wanted or len(wanted) > MAX_EVENT_TYPES:
            raise ValueError(f"types must name 1 to {MAX_EVENT_TYPES} event types")
        if before_seq is not None:
            u.check_int(before_seq, "before_seq")
        u.check_limit(limit)
        rows = await self.engine.read(
            "read_events_back",
            session_id=session_id,
            types=wanted,
            before_seq=before_seq,
            limit=limit,
        )
        return [_event(r) for r in rows]

    async def last_seq(self, session_id: str) -> int:
        last = await self.engine.read("last_seq", session_id=session_id)
        if last is None:
            raise u.no_session(session_id)
        return last

    # ---- key-value ----

    async def kv_put(
        self,
        namespace: str,
        items: Sequence[tuple[str, dict[str, Any], datetime | None]],
    ) -> None:
        u.check_text(namespace, "namespace")
        rows = [
            (
                u.check_text(key, "key"),
                u.encode_json(value, "value"),
                self._optional_time(expires, "expires_at"),
            )
            for key, value, expires in items
        ]
        if rows:
            await self.engine.write("kv_put", namespace=namespace, rows=rows, now=self._now())

    async def kv_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        value = await self.engine.read("kv_get", namespace=namespace, key=key, now=self._now())
        return u.decode_optional_json(value)

    async def kv_delete(self, namespace: str, keys: Sequence[str]) -> int:
        return await self.engine.write("kv_delete", namespace=namespace, keys=list(keys))

    async def kv_list(
        self, namespace: str, *, after_key: str | None = None, limit: int = 1000
    ) -> list[tuple[str, dict[str, Any]]]:
        rows = await self.engine.read(
            "kv_list", namespace=namespace, after=after_key or "", limit=limit, now=self._now()
        )
        return [(r["key"], u.decode_json(r["value"])) for r in rows]

    async def kv_purge_expired(self) -> int:
        return await self.engine.write("kv_purge", now=self._now())

    async def kv_append(
        self,
        namespace: str,
        value: dict[str, Any],
        *,
        expires_at: datetime | None = None,
        keep: int | None = None,
    ) -> int:
        u.check_text(namespace, "namespace")
        if keep is not None and keep < 1:
            raise InvalidArgument("keep must be at least 1", field="keep")
        return await self.engine.write(
            "kv_append",
            namespace=namespace,
            value=u.encode_json(value, "value"),
            expires=self._optional_time(expires_at, "expires_at"),
            keep=keep,
            now=self._now(),
        )

    # ---- jobs ----

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
        u.check_text(id, "id")
        u.check_text(kind, "kind")
        u.check_job_state(state)
        if session_id is not None:
            u.check_text(session_id, "session_id")
        data = u.encode_json(spec, "spec")
        row = await self.engine.write(
            "create_job",
            id=id,
            kind=kind,
            spec=data,
            session_id=session_id,
            next_fire_at=self._optional_time(next_fire_at, "next_fire_at"),
            state=state,
            now=self._now(),
        )
        if row is None:
            raise AlreadyExists(f"job {id!r} already exists")
        return _job(row)

    async def get_job(self, id: str) -> Job:
        row = await self.engine.read("get_job", id=id)
        if row is None:
            raise u.no_job(id)
        return _job(row)

    async def list_jobs(
        self, session_id: str | None = None, states: Sequence[str] | None = None
    ) -> list[Job]:
        wanted = u.check_job_states(states)
        rows = await self.engine.read("list_jobs", session_id=session_id, states=wanted)
        return [_job(r) for r in rows]

    async def update_job(
        self,
        id: str,
        *,
        kind: str | UnsetType = UNSET,
        spec: dict[str, Any] | UnsetType = UNSET,
        state: str | UnsetType = UNSET,
        next_fire_at: datetime | None | UnsetType = UNSET,
    ) -> Job:
        sets: dict[str, Any] = {}
        if kind is not UNSET:
            sets["kind"] = u.check_text(kind, "kind")
        if spec is not UNSET:
            sets["spec"] = u.encode_json(spec, "spec")  # type: ignore[arg-type]
        if state is not UNSET:
            sets["state"] = u.check_job_state(state)
        if next_fire_at is not UNSET:
            sets["next_fire_at"] = self._optional_time(next_fire_at, "next_fire_at")
        if not sets:
            return await self.get_job(id)
        row = await self.engine.write("update_job", id=id, sets=sets, now=self._now())
        if row is None:
            raise u.no_job(id)
        return _job(row)

    async def delete_job(self, id: str) -> None:
        if not await self.engine.write("delete_job", id=id):
            raise u.no_job(id)

    async def due_jobs(self, before: datetime, limit: int = 100) -> list[Job]:
        b = self._time(before, "before")
        u.check_limit(limit)
        return [_job(r) for r in await self.engine.read("due_jobs", before=b, limit=limit)]

    async def list_runs(self, job_id: str, limit: int = 100) -> list[JobRun]:
        u.check_limit(limit)
        return [_run(r) for r in await self.engine.read("list_runs", job_id=job_id, limit=limit)]

    async def get_run(self, run_id: int) -> JobRun:
        u.check_int(run_id, "run_id")
        row = await self.engine.read("get_run", run_id=run_id)
        if row is None:
            raise u.no_run(run_id)
        return _run(row)

    async def update_run(
        self, run_id: int, state: str, detail: dict[str, Any] | None = None
    ) -> JobRun:
        u.check_int(run_id, "run_id")
        u.check_text(state, "state")
        data = u.encode_optional_json(detail)
        row = await self.engine.write(
            "update_run", run_id=run_id, state=state, detail=data, now=self._now()
        )
        if row is None:
            raise u.no_run(run_id)
        return _run(row)

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
        expected = self._time(expected_next_fire_at, "expected_next_fire_at")
        new = self._optional_time(new_next_fire_at, "new_next_fire_at")
        u.check_text(run_state, "run_state")
        inp = u.check_fire_input(input)
        data = u.encode_optional_json(detail)
        extra = [
            (self._time(when, "extra_runs"), state, u.encode_optional_json(more))
            for when, state, more in extra_runs
        ]
        rows = await self.engine.write(
            "fire_job",
            job_id=job_id,
            expected=expected,
            new=new,
            run_state=run_state,
            input=inp,
            detail=data,
            now=self._now(),
            counts=counts,
            extra_runs=extra,
        )
        if rows is None:
            return None
        job, run, item = rows
        return FireResult(
            job=_job(job), run=_run(run), input=None if item is None else _input(item)
        )

    async def fire_jobs(self, fires: Sequence[FireRequest]) -> list[FireResult | None]:
        requests, seen = [], set()
        for fire in fires:
            if not isinstance(fire, FireRequest):
                raise TypeError(f"fires must be FireRequests, not {type(fire).__name__}")
            u.check_text(fire.job_id, "job_id")
            if fire.job_id in seen:
                raise ValueError(f"job {fire.job_id!r} is in fires twice")
            seen.add(fire.job_id)
            requests.append(
                (
                    fire.job_id,
                    self._time(fire.expected_next_fire_at, "expected_next_fire_at"),
                    self._optional_time(fire.new_next_fire_at, "new_next_fire_at"),
                    u.check_text(fire.run_state, "run_state"),
                    u.check_fire_input(fire.input or ()),
                    u.encode_optional_json(fire.detail),
                )
            )
        if not requests:
            return []
        answers = await self.engine.write("fire_jobs", fires=requests, now=self._now())
        return [
            None
            if rows is None
            else FireResult(job=_job(rows[0]), run=_run(rows[1]), input=_input(rows[2]))
            for rows in answers
        ]
