"""The node assembly: agent choice from config, and start-up recovery."""

from __future__ import annotations

from runtime.agents import OpenAIAgent, ScriptedAgent
from runtime.config import Config, ScriptedConfig
from runtime.store import open_store
from tools.node import make_agent, recover


def test_the_config_chooses_the_agent():
    scripted = make_agent(Config(scripted=ScriptedConfig(token_delay=0.5)))
    assert isinstance(scripted, ScriptedAgent) and scripted.token_delay == 0.5
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
        (end,) = await store.read_events("cut")
        assert (end.type, end.payload["status"]) == ("stream_end", "interrupted")
        assert [i.state for i in await store.list_inputs("cut")] == ["interrupted"]


def test_a_bad_setting_stops_serve_with_one_clear_line(tmp_path, capsys):
    import gc

    from runtime.cli import main

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
