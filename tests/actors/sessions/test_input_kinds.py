"""Input kinds (``actors.sessions.kinds``): each source's payload is read only by the feature
that owns it, so a key one feature writes never means something to another.

The defect these pin: the session hub read any payload's ``run_id`` as a scheduler run, so a
GitHub webhook whose CI run id equalled another user's job run settled that user's run record
(and stamped its ``job_id`` on the webhook turn's ``stream_start``); an id above int64 crashed
the session actor and left its input ``running``.
"""

from __future__ import annotations

import pytest
import trio.testing

from tests.support.mock_node import DAY, T0, node, once
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import Submit
from turnstile.actors.sessions.inputs import OtherInput
from turnstile.actors.sessions.kinds import PlainKind, session_kinds
from turnstile.actors.webhooks.inputs import WebhookEvent

pytestmark = pytest.mark.guard(DAY)


def _webhook(run_id: int) -> dict:
    """A GitHub failure's payload as the webhooks feature stores it (its CI ``run_id``)."""
    return {
        "type": "check_run_failed",
        "name": "tests",
        "conclusion": "failure",
        "owner": "ann",
        "repo": "app",
        "run_id": run_id,
        "hook": "github",
        "event": "check_run",
        "delivery_id": "github:d-1",
        "source_ref": f"ann/app#check_run:{run_id}",
    }


async def test_a_webhooks_run_id_never_settles_another_users_job_run(autojump_clock):
    async with node() as n:
        # (the mock node has sessions' and scheduling's kinds; a node adds the webhooks')
        n.services.input_kinds.register(PlainKind("webhook", WebhookEvent))
        await n.store.create_session("bob/s", "bob")
        job = await n.add(session_id="bob/s", schedule=once(T0.replace(minute=1)))
        await trio.sleep(120)  # on the mock clock: bob's job fires at 12:01 and its turn runs
        await trio.testing.wait_all_tasks_blocked()
        (bobs,) = await JobStore(n.store).list_runs(job.id)
        assert bobs.state == "turn_completed"

        ref = n.registry.ref("session:s")
        await ref.ask(Submit(source="webhook", content="[CI FAILED]", payload=_webhook(bobs.id)))
        await n.seen.until(b'"stream_end"')
        (start,) = n.starts()
        assert start["source"] == "webhook"
        assert "job_id" not in start and "run_id" not in start
        (end,) = n.ends()
        assert end["status"] == "completed"
        assert await JobStore(n.store).list_runs(job.id) == [bobs]  # untouched, updated_at included


async def test_a_webhooks_run_id_beyond_int64_is_an_ordinary_turn(autojump_clock):
    async with node(start_scheduler=False) as n:
        n.services.input_kinds.register(PlainKind("webhook", WebhookEvent))
        ref = n.registry.ref("session:s")
        await ref.ask(Submit(source="webhook", content="[CI FAILED]", payload=_webhook(2**70)))
        await ref.ask(Submit(content="after"))
        await n.seen.until(b'"stream_end"', 2)
        await trio.testing.wait_all_tasks_blocked()  # the second turn's inbox row settles
        assert [e["status"] for e in n.ends()] == ["completed", "completed"]
        inputs = await n.store.list_inputs("s")
        assert [i.state for i in inputs] == ["done", "done"]
        assert inputs[0].payload["run_id"] == 2**70  # stored as sent


async def test_a_scheduled_input_settles_only_its_own_run(autojump_clock):
    """A scheduled payload that names a run of another input (written by hand, or damaged)
    settles nothing: the run must be that input's own."""
    async with node() as n:
        await n.store.create_session("bob/s", "bob")
        job = await n.add(session_id="bob/s", schedule=once(T0.replace(minute=1)))
        await trio.sleep(120)
        await trio.testing.wait_all_tasks_blocked()
        (bobs,) = await JobStore(n.store).list_runs(job.id)
        ref = n.registry.ref("session:s")
        forged = {"job_id": job.id, "run_id": bobs.id}
        await ref.ask(Submit(source="once", content="forged", payload=forged))
        await n.seen.until(b'"stream_end"')
        (start,) = n.starts()
        assert "job_id" not in start and "run_id" not in start
        assert await JobStore(n.store).list_runs(job.id) == [bobs]


def test_each_source_has_one_owner():
    kinds = session_kinds()
    with pytest.raises(ValueError) as caught:
        kinds.register(PlainKind("user", WebhookEvent))
    assert str(caught.value) == (
        "input source 'user' is already registered (PlainKind('user', UserMessage))"
    )


def test_a_source_nobody_registered_is_plain_text_and_not_scheduled():
    kinds = session_kinds()
    got = kinds.decode("mystery", {"content": "hi", "run_id": 1, "job_id": "j"})
    assert (type(got), got) == (OtherInput, OtherInput(content="hi"))
    assert not kinds.scheduled("mystery")
    assert "mystery" not in kinds
