"""``/metrics`` as Prometheus scrapes it: a real HTTP client against a node on loopback, the text
parsed by ``prometheus_client``'s own parser. After a user turn and an immediate recall (a fire
through the scheduler) with a client attached, the three latency histograms have counts, their
buckets add up, and the labels are the bounded ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.node import ALICE, new_session, running_node
from turnstile.actors.config import Config
from turnstile.actors.node import open_node
from turnstile.client import SessionStream, StreamEnd, StreamStart, open_client


async def until(stream: SessionStream, matches: Callable[[Any], bool]) -> Any:
    """The data of the stream's next event that ``matches``."""
    async for event in stream:
        if matches(event.data):
            return event.data
    raise AssertionError("the stream ended first")


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def histogram_count(family, **labels: str) -> float:
    """The ``_count`` of the histogram ``family``, summed over series matching ``labels``."""
    return sum(
        sample.value
        for sample in family.samples
        if sample.name == f"{family.name}_count"
        and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def test_a_scrape_after_turns_has_turn_fire_and_delivery_histograms(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "m")
        async with (
            open_client(node.url, ALICE) as client,
            client.attach("m") as stream,
            node.http() as http,
        ):
            ack = await stream.send("hello")
            end = await until(stream, lambda e: isinstance(e, StreamEnd))
            assert (end.input_id, end.status) == (ack.input_id, "completed")
            arguments = {"call_type": "immediate", "additional_context_message": "check the log"}
            await stream.call("schedule_recall", arguments)  # raises unless ok
            await until(stream, lambda e: isinstance(e, StreamStart) and e.source == "recall")
            end = await until(stream, lambda e: isinstance(e, StreamEnd))
            assert end.status == "completed"
            response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    seen = families(response.text)

    turns = seen["turnstile_turn_seconds"]
    assert turns.type == "histogram"
    assert histogram_count(turns, status="completed", source="user") == 1
    assert histogram_count(turns, status="completed", source="recall") == 1
    buckets = [s for s in turns.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
    assert sum(s.value for s in buckets) == histogram_count(turns)

    lateness = seen["turnstile_scheduler_lateness_seconds"]
    assert lateness.type == "histogram"
    assert histogram_count(lateness, kind="recall") == 1

    delivery = seen["turnstile_event_delivery_seconds"]
    assert delivery.type == "histogram"
    # every live event of both turns reached the attached client: turn_queued, stream_start,
    # the deltas, stream_end, the recall's updates
    assert histogram_count(delivery) >= 8

    assert seen["turnstile_turns"].type == "counter"  # the parser drops ``_total``
    completed = [s for s in seen["turnstile_turns"].samples if s.labels == {"status": "completed"}]
    assert [s.value for s in completed] == [2.0]
    assert seen["turnstile_websocket_connections"].samples[0].value == 1
    # no label takes a session, user or input id: a series per id would grow without bound
    for family in seen.values():
        for sample in family.samples:
            assert "m" not in sample.labels.values() and "alice" not in sample.labels.values()
            assert not {"session_id", "user", "input_id", "owner"} & set(sample.labels)


async def test_two_nodes_in_one_process_each_scrape_their_own_registry(tmp_path):
    """Per-node registries: a turn on one node does not show on the other's ``/metrics``."""
    tokens = {"tok-0123456789abcdef": "ada"}
    config_a = Config(store=f"sqlite:///{tmp_path}/a.db")
    config_b = Config(store=f"sqlite:///{tmp_path}/b.db")
    async with (
        open_node(config_a, tokens=tokens, serve=False) as a,
        open_node(config_b, tokens=tokens, serve=False) as b,
    ):
        await a.directory.create_session("ada", session_id="s")
        headers = {"Authorization": "Bearer tok-0123456789abcdef"}
        for node, created in ((a, 1), (b, 0)):
            transport = httpx.ASGITransport(app=node.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://n") as http:
                text = (await http.get("/metrics", headers=headers)).text
            samples = families(text)["turnstile_sessions_created"].samples
            assert [s.value for s in samples if s.name.endswith("_total")] == [created]
