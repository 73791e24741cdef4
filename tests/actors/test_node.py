"""The node assembly: agent choice from config, and start-up recovery."""

from __future__ import annotations

from turnstile.actors.config import Config, ScriptedConfig
from turnstile.actors.demo import DemoAgent
from turnstile.actors.node import make_agent, recover
from turnstile.actors.scheduling.schema import SCHEDULING
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.turns import register_scheduled_kinds
from turnstile.actors.sessions.agents import OpenAIAgent, ScriptedAgent
from turnstile.actors.sessions.kinds import session_kinds
from turnstile.runtime.store import open_store


def test_the_config_chooses_the_agent():
    demo = make_agent(Config(scripted=ScriptedConfig(token_delay=0.5)))  # the default
    assert isinstance(demo, DemoAgent) and demo.token_delay == 0.5
    scripted = make_agent(Config(agent="scripted", scripted=ScriptedConfig(token_delay=0.5)))
    assert type(scripted) is ScriptedAgent and scripted.token_delay == 0.5
    openai = make_agent(
        Config(agent="openai", openai={"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    )
    assert isinstance(openai, OpenAIAgent)
    assert (openai.base_url, openai.model) == ("http://127.0.0.1:9/v1", "m")


async def test_recovery_closes_cut_off_turns_and_lists_sessions_with_work():
    async with open_store("sqlite:///:memory:") as store:
        for sid in ("cut", "waiting", "idle"):
            await store.create_session(sid, "ada")
        await store.enqueue_input("cut", "user", {"content": "a"})
        await store.claim_next_input("cut")  # running when the "crash" happened
        await store.enqueue_input("waiting", "user", {"content": "b"})
        assert await recover(store) == ["waiting"]
        start, end = await store.read_events("cut")  # no start was stored: it is put back
        assert (start.type, start.payload["content"]) == ("stream_start", "a")
        assert (end.type, end.payload["status"]) == ("stream_end", "interrupted")
        assert [i.state for i in await store.list_inputs("cut")] == ["interrupted"]


async def test_recovery_runs_a_cut_off_turn_again_at_most_max_reruns_times():
    """With ``max_reruns`` the cut-off turn is closed visibly, then its input is queued again
    (first in its session); a turn that keeps being cut off is given up after that many."""
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        cut = await store.enqueue_input("s", "user", {"content": "a"})
        behind = await store.enqueue_input("s", "user", {"content": "b"})
        for attempt in (1, 2):
            claimed = await store.claim_next_input("s")
            assert claimed.id == cut.id
            assert await recover(store, max_reruns=2) == ["s"]
            (item, waiting) = await store.list_inputs("s")
            assert (item.state, item.detail, waiting.id) == (
                "queued",
                {"reruns": attempt},
                behind.id,
            )
        await store.claim_next_input("s")  # cut off a third time: given up
        assert await recover(store, max_reruns=2) == ["s"]  # "b" still waits
        assert (await store.list_inputs("s"))[0].state == "interrupted"
        ends = [e.payload["error"] for e in await store.read_events("s") if e.type == "stream_end"]
        assert ends == ["the node stopped during this turn; it runs again"] * 2 + [
            "the node stopped during this turn"
        ]


async def test_recovery_restores_a_turn_start_the_crash_took():
    """stream_start is stored together with the events after it, so a kill can take it; the
    restart puts it back before the closure, so the transcript keeps the input."""
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        done = await store.enqueue_input("s", "user", {"content": "first"})
        await store.claim_next_input("s")
        await store.append_events(
            "s",
            [
                ("stream_start", {"input_id": done.id, "source": "user", "content": "first"}),
                ("stream_end", {"input_id": done.id, "status": "completed", "text": "ok"}),
            ],
        )
        await store.finish_input(done.id, "done")
        cut = await store.enqueue_input("s", "user", {"content": "second"})
        await store.append_events("s", [("turn_queued", {"input_id": cut.id, "ahead": 0})])
        await store.claim_next_input("s")  # running; its stream_start never reached the store
        started = await store.enqueue_input("s", "user", {"content": "third"})
        await recover(store)
        events = await store.read_events("s", 3)
        assert [(e.type, e.payload["input_id"]) for e in events] == [
            ("stream_start", cut.id),
            ("stream_end", cut.id),
        ]
        assert events[0].payload["content"] == "second"
        assert events[1].payload["status"] == "interrupted"
        # a turn whose start did reach the store gets only its closure
        await store.claim_next_input("s")
        await store.append_events(
            "s",
            [("stream_start", {"input_id": started.id, "source": "user", "content": "third"})]
            + [("stream_delta", {"input_id": started.id, "text": "w "})] * 3,
        )
        await recover(store)
        tail = await store.read_events("s", 5)
        assert [e.type for e in tail] == ["stream_start"] + ["stream_delta"] * 3 + ["stream_end"]


def test_a_bad_setting_stops_serve_with_one_clear_line(tmp_path, capsys):
    import gc

    from turnstile.actors.cli import main

    thresholds = gc.get_threshold()  # serve tunes the GC for the process; put it back after
    config = tmp_path / "turnstile.toml"
    config.write_text("[heartbeat]\ninterval_minutes = 5\n")
    code = main(
        ["serve", "--config", str(config), "--port", "0", "--store", f"sqlite:///{tmp_path}/x.db",
         "--dev-token", "a-dev-token-of-some-length"]
    )  # fmt: skip
    gc.set_threshold(*thresholds)
    assert code == 2
    err = capsys.readouterr().err
    assert "turnstile: cannot start: heartbeat.interval_minutes" in err
    assert "Traceback" not in err


async def test_recovery_settles_the_run_of_a_cut_off_turn_after_a_long_outage():
    """The delivered run is followed by 59 coalesced ones (an hourly job down 60 h): recovery
    finds it by the run id in the inbox payload, not among the job's latest runs."""
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 11, 21, 12, 30, tzinfo=UTC)
    async with open_store("sqlite:///:memory:", migrations=[SCHEDULING]) as store:
        await store.create_session("s", "ada")
        await JobStore(store).create_job("j", kind="cron", spec={}, session_id="s", next_fire_at=t0)
        missed = [(t0 + timedelta(hours=k), "coalesced", None) for k in range(1, 60)]
        fired = await JobStore(store).fire_job(
            "j",
            t0,
            t0 + timedelta(hours=60),
            input=("cron", {"content": "hourly", "job_id": "j"}),
            extra_runs=missed,
        )
        await store.claim_next_input("s")  # its turn was running when the node died
        kinds = session_kinds()  # as a node's scheduling feature registers them
        register_scheduled_kinds(
            kinds, store, tool_profiles=dict, notify=lambda: None, disable_job=None
        )
        await recover(store, kinds=kinds)
        runs = await JobStore(store).list_runs("j", limit=100)
        assert [r.state for r in runs if r.id == fired.run.id] == ["turn_interrupted"]
