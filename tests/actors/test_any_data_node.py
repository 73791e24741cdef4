"""End to end, on both backends (issue 23, 'PostgreSQL loses data that SQLite keeps'): a page
``http.get`` fetched holding U+0000 (a raw 0x00 byte and the JSON escape) is stored as the
tool's result and read back as fetched, and a signed GitHub delivery whose body holds
``\\u0000`` is accepted (202), recorded and delivered as a turn. On PostgreSQL both failed with
``StoreError`` before the store escaped U+0000 (``runtime/store/escaping.py``)."""

from __future__ import annotations

from tests.actors.webhooks.test_ingress_node import (
    ADA,
    PR3,
    auth,
    node_with,
    session,
    webhook_inputs,
)
from tests.support.github import check_run_event, deliver
from turnstile.actors.config import Config
from turnstile.actors.sessions.agents.scripted import ScriptedAgent
from turnstile.tools.modules.http import HttpModule

PAGE = "<html>a\x00b \ufdd0 \\u0000</html>"


async def test_an_http_get_result_holding_nul_is_stored_and_read_back(store_url, monkeypatch):
    async def page(self, method, url, headers, timeout, content, consume):  # noqa: ASYNC109
        return {"status_code": 200, "headers": {}, "body": PAGE, "encoding": "text"}

    monkeypatch.setattr(HttpModule, "_exchange", page)
    config = Config(store=store_url, policies={"http.get": "AUTO"})
    agent = ScriptedAgent()
    async with node_with(store_url, agent=agent, config=config) as (node, http, _):
        recorder = await session(node, http, ADA, "s")
        call = '/call http.get {"url": "https://x.test/"}'
        sent = await http.post("/sessions/s/messages", json={"content": call}, headers=auth(ADA))
        assert sent.status_code in (200, 201, 202), sent.text
        await recorder.until(b'"stream_end"')
        events = await node.store.read_events("ada/s")
        ends = [e.payload for e in events if e.type == "stream_end"]
        assert [end.get("status") for end in ends] == ["completed"], ends
        results = [e.payload for e in events if e.type == "tool_call"]
        assert [r["result"]["body"] for r in results] == [PAGE], results


async def test_a_signed_delivery_holding_nul_is_accepted_and_delivered(store_url):
    async with node_with(store_url) as (node, http, _):
        recorder = await session(node, http, ADA, "pr3", PR3)
        event = check_run_event(pr=3, branch="fix-3")
        event["check_run"]["output"] = {"title": "tests failed\x00", "summary": "a\x00b"}
        answer = await deliver(http, "check_run", event)
        assert answer.status_code == 202, answer.text
        await recorder.until(b'"stream_end"')
        (item,) = await webhook_inputs(node, "ada/pr3")
        assert item.state == "done"
        assert (item.payload["output_title"], item.payload["output_summary"]) == (
            "tests failed\x00",
            "a\x00b",
        )


async def test_a_lone_surrogate_from_a_client_is_a_typed_400(store_url):
    """msgspec refuses the escape of a lone surrogate: the gateway answers ``bad_message``."""
    async with node_with(store_url) as (node, http, _):
        await session(node, http, ADA, "s")
        sent = await http.post(
            "/sessions/s/messages",
            content=b'{"content": "a\\ud800b"}',
            headers={**auth(ADA), "content-type": "application/json"},
        )
        assert sent.status_code == 400, sent.text
        assert sent.json()["error"]["code"] == "bad_message"
        assert await node.store.list_inputs("ada/s") == []
