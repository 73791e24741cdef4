"""Summary injection end to end: a real node, the openai agent, the strict stand-in server.

The request a turn sends must be the system prompt, then the memory message, then the
history, then the input, and the stand-in must accept it as OpenAI would."""

from __future__ import annotations

import pytest

from tests.support.agents import ENV_VARS
from tests.support.fake_openai import start_standin, text_stream
from tests.support.node import ALICE, new_session, running_node
from turnstile.actors.memory.injection import memory_message
from turnstile.actors.sessions.agents import OpenAIAgent
from turnstile.client import SessionStream, StreamEnd, open_client


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def standin(nursery):
    standin = await start_standin(nursery)
    yield standin
    assert standin.rejected == []


async def turn(stream: SessionStream, content: str, msg_id: str) -> StreamEnd:
    """Send ``content`` and read the stream up to its turn's end."""
    ack = await stream.send(content, client_msg_id=msg_id)
    async for event in stream:
        if isinstance(event.data, StreamEnd) and event.data.input_id == ack.input_id:
            return event.data
    raise AssertionError("the stream ended before the turn did")


async def test_the_request_carries_the_memory_after_the_system_prompt_before_history(
    tmp_path, standin
):
    standin.script(text_stream("Hello."), text_stream("Dark roast, as usual."))
    agent = OpenAIAgent(
        base_url=standin.base_url, model="m", max_retries=0, system_prompt="Be brief."
    )
    async with running_node(tmp_path, agent=agent) as node:
        await new_session(node, "s1")
        await new_session(node, "s2")
        async with open_client(node.url, ALICE) as client, client.attach("s1") as stream:
            assert (await turn(stream, "hi", "m1")).status == "completed"
            await client.put_memory_summary("Likes dark roast.")  # raises unless accepted
            end = await turn(stream, "coffee?", "m2")
            assert (end.status, end.text) == ("completed", "Dark roast, as usual.")
    first, second = standin.requests
    assert [m["role"] for m in first.body["messages"]] == ["system", "user"]  # no summary yet
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "user"]
    assert messages[0]["content"].endswith("Be brief.")  # the runtime's prompt, then the agent's
    assert messages[1] == {
        "role": "system",
        "content": memory_message("Likes dark roast."),
    }
    assert messages[2:] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "coffee?"},
    ]
