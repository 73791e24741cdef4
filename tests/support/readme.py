"""README.md's embedding example: the fenced ``python`` block right after the
``<!-- embed-example -->`` marker, and what it prints (run by tests/test_readme_example.py, and
again inside the installed wheel by tests/test_wheel.py)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
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
