"""README.md's embedding example runs as it stands.

The example is the fenced ``python`` block right after the ``<!-- embed-example -->`` marker in
README.md. It is run exactly as written, in a fresh interpreter (``python -c``), from an empty
temporary directory (it creates its SQLite file and the filesystem module's workspace there),
with a timeout: it sends one message, waits for the reply and exits by itself.
tests/test_wheel.py runs the same block again inside the installed wheel.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- embed-example -->"
#: What the example prints when the turn came back: its status and the agent's answer.
EXPECTED_OUTPUT = "completed HELLO\n"

_BLOCK = re.compile(r"\A\s*```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def readme_example(readme: Path = README) -> str:
    """The code of the fenced ``python`` block that follows ``MARKER`` in ``readme``.

    Raises:
        ValueError: the marker is missing or twice there, or no ``python`` block follows it.
    """
    text = readme.read_text(encoding="utf-8")
    if text.count(MARKER) != 1:
        raise ValueError(f"{readme.name} must hold {MARKER!r} exactly once")
    found = _BLOCK.match(text.split(MARKER, 1)[1])
    if found is None:
        raise ValueError(f"no ```python block right after {MARKER!r} in {readme.name}")
    return found.group(1)


def test_the_marker_is_followed_by_the_example():
    code = readme_example()
    assert "from turnstile import Config, open_node" in code
    assert "trio.run(main)" in code


def test_the_readme_example_runs_and_prints_the_reply(tmp_path):
    code = readme_example()
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the README example did not finish within {exc.timeout} s")
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stdout == EXPECTED_OUTPUT, result.stderr
