"""docs/client.md's example runs as it stands, against a real node.

The example is the fenced ``python`` block right after the ``<!-- client-example -->`` marker.
It runs exactly as written in a fresh interpreter, with ``TURNSTILE_URL`` and
``TURNSTILE_TOKEN`` pointing at a node on loopback (the scripted agent, whose answer is
``You said: …``); it sends one message, prints the streamed answer and a tool call's result,
and exits by itself.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import trio

from tests.support.node import ALICE, running_node

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
MARKER = "<!-- client-example -->"
_BLOCK = re.compile(r"\A\s*```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
WAIT = 60


def example() -> str:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, f"docs/client.md must hold {MARKER!r} exactly once"
    found = _BLOCK.match(text.split(MARKER, 1)[1])
    assert found is not None, f"no ```python block right after {MARKER!r}"
    return found.group(1)


def test_the_readme_links_the_client_docs():
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "docs/client.md" in readme


async def test_the_example_runs_against_a_node(tmp_path):
    async with running_node(tmp_path) as node:
        env = {**os.environ, "TURNSTILE_URL": node.url, "TURNSTILE_TOKEN": ALICE}
        with trio.fail_after(WAIT):
            done = await trio.run_process(
                [sys.executable, "-c", example()],
                cwd=tmp_path,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "You said: hello\n[completed]\n{'text': 'hi'}\n"
