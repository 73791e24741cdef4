"""What a client sees of a store outage, and what a session's log must show after one.

Shared by the store-outage tests (``tests/e2e/test_store_outage*.py``): the fixed ``503`` a
request gets while the store cannot be reached, and the turns a session's stored events show
(each acknowledged input started once and ended once: nothing lost, nothing run twice).
"""

from __future__ import annotations

from collections import Counter

import httpx

__all__ = ["UNAVAILABLE", "Turns", "assert_unavailable", "turns"]

UNAVAILABLE = {
    "error": {
        "code": "store_unavailable",
        "message": "the store is unavailable; retry in a few seconds",
    }
}


def assert_unavailable(answer: httpx.Response, *, database: tuple[str, ...]) -> None:
    """``answer`` is the outage's 503, and says nothing of the database (``database``: the
    strings that would give it away: host, port, schema, file path, SQL, driver names)."""
    request = f"{answer.request.method} {answer.request.url.path}"
    assert answer.status_code == 503, (request, answer.status_code, answer.text)
    assert answer.headers["retry-after"] == "5", request
    assert answer.json() == UNAVAILABLE, request
    for secret in database:
        assert secret not in answer.text, (request, secret)


class Turns:
    """A session's turns as its stored events show them: how many times each input's turn
    started and ended."""

    def __init__(self, events: list[dict]) -> None:
        self.events = events
        self.starts = Counter(e["input_id"] for e in events if e["type"] == "stream_start")
        self.ends = Counter(e["input_id"] for e in events if e["type"] == "stream_end")

    def ran_once(self, input_id: int) -> bool:
        """Whether ``input_id``'s turn started exactly once and ended exactly once."""
        return self.starts[input_id] == 1 and self.ends[input_id] == 1

    def assert_each_ran_once(self, input_ids: list[int]) -> None:
        """Every one of ``input_ids`` ran exactly once, and no turn of any input started or
        ended twice; the events are gapless."""
        for input_id in input_ids:
            assert self.ran_once(input_id), (input_id, self.starts, self.ends)
        assert all(n == 1 for n in self.starts.values()), self.starts  # nothing ran twice
        assert all(n == 1 for n in self.ends.values()), self.ends
        assert [e["seq"] for e in self.events] == list(range(1, len(self.events) + 1))


async def turns(http: httpx.AsyncClient, session_id: str) -> Turns | None:
    """The session's turns as ``GET /sessions/{id}/events`` shows them (None unless it answers
    200: for use inside ``eventually``)."""
    answer = await http.get(f"/sessions/{session_id}/events")
    if answer.status_code != 200:
        return None
    return Turns(answer.json()["events"])
