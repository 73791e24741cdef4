"""The session directory over a real SQLite store and real session actors: namespaces, limits,
deletion and what the other features hook into it.

The hooks are the ones a node's features would fill (``SessionHooks``); here each is a small
recorder, so a test sees exactly which keys they were called with and when.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.support.agents import GatedAgent
from tests.support.sessions import NoTools, Recorder
from turnstile.actors.sessions.actor import (
    GetStatus,
    SessionActor,
    SessionLimits,
    SessionServices,
)
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.actors.sessions.directory import SessionDirectory, create_derived_session
from turnstile.actors.sessions.hooks import SessionHooks
from turnstile.runtime.errors import (
    BlockedByAutomations,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    StoreError,
    TurnstileError,
)
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor


class EchoTools(NoTools):
    """A tool caller whose one tool answers with the session key it was called for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    async def call(self, session_id, owner, name, arguments, *, idempotency_key=None, call_id=None):
        self.calls.append((session_id, owner, name))
        return ToolResult(
            ok=True, data={"session_id": session_id, "jobs": [{"session_id": session_id}]}
        )


class Subscriber(Recorder):
    """A ``Recorder`` that also hears about the session's deletion."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted_as: list[str] = []

    def deleted(self, session_id) -> None:
        self.deleted_as.append(session_id)


@asynccontextmanager
async def directory(
    tmp_path, hooks: SessionHooks | None = None, max_sessions: int = 10
) -> AsyncIterator[SessionDirectory]:
    """A directory over a SQLite file in ``tmp_path`` and a registry of session actors."""
    async with open_store(f"sqlite:///{tmp_path}/node.db") as store:
        services = SessionServices(
            store=store,
            agent=GatedAgent(),
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
        )
        async with open_supervisor("sessions", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=30.0)
            registry.register("session", lambda key: SessionActor(key, services))
            yield SessionDirectory(
                store,
                registry,
                EchoTools(),
                max_sessions_per_user=max_sessions,
                metrics=Metrics(),
                hooks=hooks,
            )


def ids(sessions) -> list[str]:
    return [s.id for s in sessions]


# -- namespaces ------------------------------------------------------------------------------


async def answers_of(d: SessionDirectory, user: str, name: str) -> list[Any]:
    """What ``user`` gets from every per-session operation on ``name``: the value, or the
    error's type, code and message."""
    operations = [
        lambda: d.get_session(user, name),
        lambda: d.submit(user, name, "hello"),
        lambda: d.stop(user, name),
        lambda: d.set_policy(user, name, "inject"),
        lambda: d.attach(user, name, Subscriber()),
        lambda: d.detach(user, name, Subscriber()),
        lambda: d.read_events(user, name),
        lambda: d.history(user, name),
        lambda: d.call_tool(user, name, "echo", {}),
        lambda: d.delete_session(user, name, confirm=True),
    ]
    out = []
    for operation in operations:
        try:
            out.append(await operation())
        except TurnstileError as exc:
            out.append((type(exc).__name__, exc.code, str(exc)))
    return out


async def test_another_users_session_answers_exactly_like_a_missing_one(tmp_path):
    async with directory(tmp_path) as d:
        missing = await answers_of(d, "bob", "main")
        assert missing == [("NotFound", "not_found", "no session with id 'main'")] * 10

        await d.create_session("ada", session_id="main")
        await d.submit("ada", "main", "private")
        assert await answers_of(d, "bob", "main") == missing
        assert (
            await answers_of(d, "bob", "ada/main")
            == [("NotFound", "not_found", "no session with id 'ada/main'")] * 10
        )  # a key is not a name

        await d.store.create_session("bob/odd", "ada")  # a row whose key and owner disagree
        assert (
            await answers_of(d, "bob", "odd")
            == [("NotFound", "not_found", "no session with id 'odd'")] * 10
        )

        # Bob's "main" is an ordinary create, and a session of his own.
        created = await d.create_session("bob", session_id="main")
        assert (created.id, created.owner) == ("main", "bob")
        assert await d.read_events("bob", "main") == []
        first = (await d.read_events("ada", "main"))[0]  # Ada's input is where it was
        assert (first.type, first.payload["input_id"]) == ("turn_queued", 1)


async def test_answers_name_sessions_and_never_show_keys(tmp_path):
    async with directory(tmp_path) as d:
        created = await d.create_session("ada", session_id="main", metadata={"k": "v"})
        assert (created.id, created.owner, created.metadata) == ("main", "ada", {"k": "v"})
        assert (await d.get_session("ada", "main")).id == "main"
        await d.create_session("ada", session_id="b")
        assert ids(await d.list_sessions("ada")) == ["b", "main"]
        assert ids(await d.list_sessions("ada", after_id="b")) == ["main"]

        result = await d.call_tool("ada", "main", "echo", {})
        assert result.data == {"session_id": "main", "jobs": [{"session_id": "main"}]}
        assert d.tools.calls == [("ada/main", "ada", "echo")]  # the tool got the key

        unnamed = await d.create_session("ada")
        assert "/" not in unnamed.id and len(unnamed.id) == 32
        assert (await d.get_session("ada", unnamed.id)).owner == "ada"


# -- the per-user limit ----------------------------------------------------------------------


async def test_the_session_limit_counts_derived_sessions_and_deleting_frees_them(tmp_path):
    async with directory(tmp_path, max_sessions=3) as d:
        await d.create_session("ada", session_id="main")
        assert await create_derived_session(d.store, 3, "ada/main", ".heartbeat") == (
            "ada/main.heartbeat"
        )
        await d.create_session("ada", session_id="b")
        assert ids(await d.list_sessions("ada")) == ["b", "main", "main.heartbeat"]

        with pytest.raises(LimitExceeded) as refused:
            await d.create_session("ada", session_id="c")
        assert str(refused.value) == "user 'ada' already has 3 sessions (limit 3)"
        with pytest.raises(LimitExceeded):
            await create_derived_session(d.store, 3, "ada/b", ".heartbeat")
        await d.create_session("bob", session_id="c")  # another user's count is his own

        with pytest.raises(InvalidArgument) as reserved:
            await d.create_session("ada", session_id="x.heartbeat")
        assert reserved.value.field == "id"

        await d.delete_session("ada", "main")  # with its derived session
        assert ids(await d.list_sessions("ada")) == ["b"]
        await d.create_session("ada", session_id="c")
        await d.create_session("ada", session_id="d")


# -- deleting --------------------------------------------------------------------------------


class Ending:
    """Hooks that record each call: two features' ``on_session_end``, and automations."""

    def __init__(self, jobs_on: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, str]] = []
        self.jobs_on = jobs_on
        self.hooks = SessionHooks(
            on_session_end=[self.end("watchers"), self.end("tasks")],
            automations=self.automations,
            cancel_automations=self.cancel,
        )

    def end(self, feature: str):
        async def on_session_end(key: str) -> None:
            self.calls.append((feature, key))

        return on_session_end

    async def automations(self, key: str) -> list[dict[str, Any]]:
        return [{"id": f"job-{key}", "session_id": key}] if key in self.jobs_on else []

    async def cancel(self, key: str) -> None:
        self.calls.append(("cancel", key))


async def test_deleting_a_session_ends_it_in_every_feature_derived_session_first(tmp_path):
    ending = Ending()
    async with directory(tmp_path, hooks=ending.hooks) as d:
        await d.create_session("ada", session_id="main")
        await create_derived_session(d.store, 10, "ada/main", ".heartbeat")
        watching = Subscriber()
        await d.attach("ada", "main", watching)

        await d.delete_session("ada", "main")
        assert ending.calls == [
            ("cancel", "ada/main"),
            ("cancel", "ada/main.heartbeat"),
            ("watchers", "ada/main.heartbeat"),
            ("tasks", "ada/main.heartbeat"),
            ("watchers", "ada/main"),
            ("tasks", "ada/main"),
        ]
        assert watching.deleted_as == ["main"]
        assert (
            await answers_of(d, "ada", "main")
            == [("NotFound", "not_found", "no session with id 'main'")] * 10
        )
        assert await d.list_sessions("ada") == []


@pytest.mark.parametrize("refusals", [1, 5])
async def test_a_feature_end_the_store_refuses_is_tried_again_and_the_others_still_run(
    tmp_path, refusals
):
    """Issue 23's crash harness, ``fail:N`` in a delete: the store refused one feature's end
    of the deleted session (the notification buffer's); the features after it never ran, so
    the session's watcher kept running for nobody, and the re-sent DELETE was a 404. Now each
    end is tried again (a refusal or two pass unseen) and every feature's end runs; one the
    store keeps refusing is the request's error, after the others ran."""
    ending = Ending()
    failing = {"left": refusals}

    async def buffer_end(key: str) -> None:
        if failing["left"]:
            failing["left"] -= 1
            raise StoreError("sqlite: transaction failed: disk I/O error")
        ending.calls.append(("buffer", key))

    ending.hooks.on_session_end.insert(0, buffer_end)
    async with directory(tmp_path, hooks=ending.hooks) as d:
        await d.create_session("ada", session_id="main")
        if refusals == 1:
            await d.delete_session("ada", "main")
            ends = [("buffer", "ada/main")]
        else:
            with pytest.raises(StoreError, match="disk I/O error"):
                await d.delete_session("ada", "main")
            ends = []
        assert ending.calls == [
            ("cancel", "ada/main"),
            *ends,
            ("watchers", "ada/main"),
            ("tasks", "ada/main"),
        ]
        assert await d.list_sessions("ada") == []


async def test_bound_jobs_block_a_delete_until_it_is_confirmed(tmp_path):
    ending = Ending(jobs_on=("ada/main", "ada/main.heartbeat"))
    async with directory(tmp_path, hooks=ending.hooks) as d:
        await d.create_session("ada", session_id="main")
        await create_derived_session(d.store, 10, "ada/main", ".heartbeat")

        with pytest.raises(BlockedByAutomations) as blocked:
            await d.delete_session("ada", "main")
        assert str(blocked.value) == (
            "session 'main' has 2 scheduled job(s); delete with confirm=true to remove them too"
        )
        assert blocked.value.automations == [
            {"id": "job-ada/main", "session_id": "main"},
            {"id": "job-ada/main.heartbeat", "session_id": "main.heartbeat"},
        ]
        assert ending.calls == []  # nothing cancelled, nothing ended
        assert ids(await d.list_sessions("ada")) == ["main", "main.heartbeat"]

        await d.delete_session("ada", "main", confirm=True)
        assert ending.calls[:2] == [("cancel", "ada/main"), ("cancel", "ada/main.heartbeat")]
        assert await d.list_sessions("ada") == []


# -- recalls ---------------------------------------------------------------------------------


async def test_has_recall_filters_through_the_pending_recall_hook_page_after_page(tmp_path):
    with_recall = {"ada/s1", "ada/s4", "ada/s5", "ada/s6"}
    asked: list[str] = []

    async def pending_recall(key: str) -> dict[str, Any] | None:
        asked.append(key)
        return {"trigger_at": f"at {key}"} if key in with_recall else None

    async with directory(tmp_path, hooks=SessionHooks(pending_recall=pending_recall)) as d:
        for i in range(7):
            await d.create_session("ada", session_id=f"s{i}")
        await d.create_session("bob", session_id="s1")

        async def listing(has_recall: bool, after: str | None = None) -> list[str]:
            return ids(await d.list_sessions("ada", limit=2, after_id=after, has_recall=has_recall))

        assert await listing(True) == ["s1", "s4"]  # read on past s2, s3 to fill the page
        assert await listing(True, after="s4") == ["s5", "s6"]
        assert await listing(True, after="s6") == []
        assert await listing(False) == ["s0", "s2"]
        assert await listing(False, after="s2") == ["s3"]
        assert not any(key.startswith("bob/") for key in asked)

        recalls = await d.pending_recalls("ada", ["s0", "s1", "s4"])
        assert recalls == {"s1": "at ada/s1", "s4": "at ada/s4"}


async def test_without_recalls_on_the_node_no_session_has_one(tmp_path):
    async with directory(tmp_path) as d:
        for name in ("a", "b"):
            await d.create_session("ada", session_id=name)
        assert await d.list_sessions("ada", has_recall=True) == []
        assert ids(await d.list_sessions("ada", has_recall=False)) == ["a", "b"]
        assert await d.pending_recalls("ada", ["a"]) == {}


# -- attaching -------------------------------------------------------------------------------


async def test_on_attach_hooks_run_in_order_once_the_client_is_attached(tmp_path):
    seen: list[tuple[str, str, int]] = []
    hooks = SessionHooks()

    def hook(name: str):
        async def on_attach(key: str) -> None:
            status = await d.registry.ref(f"session:{key}").ask(GetStatus())
            seen.append((name, key, status.subscribers))

        return on_attach

    hooks.on_attach.extend([hook("notifications"), hook("approvals")])
    async with directory(tmp_path, hooks=hooks) as d:
        await d.create_session("ada", session_id="main")
        attached = await d.attach("ada", "main", Subscriber())
        assert attached.last_seq == 0
        assert seen == [("notifications", "ada/main", 1), ("approvals", "ada/main", 1)]

        with pytest.raises(NotFound):
            await d.attach("bob", "main", Subscriber())
        assert len(seen) == 2  # no hook for a refused attach
