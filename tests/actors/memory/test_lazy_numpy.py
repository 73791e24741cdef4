"""A node without an embedder never imports numpy.

numpy is only needed for embeddings (the vectors, the per-user matrices, their search). It
cost every process that imported the node about 0.1 s of a ~1 s start (``turnstile serve``,
every CLI command, each node the test suite and the crash harness start), so the memory
feature imports it where vectors are made. A node that saves and searches facts by words
must not load it.
"""

from __future__ import annotations

from tests.support.serve import run_script

_NO_NUMPY = """
import sys, trio, httpx
from turnstile.actors.config import Config
from turnstile.actors.node import open_node

async def main(db):
    config = Config(port=0, store=f"sqlite:///{db}", agent="scripted")
    async with open_node(config, tokens={"tok": "ann"}) as node:
        print("at start", "numpy" in sys.modules, flush=True)
        async with httpx.AsyncClient(
            base_url=node.url, headers={"Authorization": "Bearer tok"}, timeout=120
        ) as http:
            saved = await http.put(
                "/memory/facts", json={"category": "drinks", "key": "coffee", "value": "dark"}
            )
            found = await http.get("/memory/search", params={"query": "coffee"})
        print("saved", saved.status_code, "found", found.status_code, found.text, flush=True)
        print("after", "numpy" in sys.modules, flush=True)

trio.run(main, sys.argv[1])
"""


async def test_a_node_saves_and_searches_facts_without_importing_numpy(tmp_path):
    out = await run_script(_NO_NUMPY, str(tmp_path / "node.db"))
    assert "at start False" in out
    assert "saved 200 found 200" in out
    assert '"dark"' in out  # the search found the fact
    assert "after False" in out
