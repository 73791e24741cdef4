"""README.md's embedding example runs as it stands.

The example is the fenced ``python`` block right after the ``<!-- embed-example -->`` marker in
README.md. It is run exactly as written, in a fresh interpreter (``python -c``), from an empty
temporary directory (it creates its SQLite file and the filesystem module's workspace there),
with a timeout: it sends one message, waits for the reply and exits by itself.
tests/test_wheel.py runs the same block again inside the installed wheel.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.readme import EXPECTED_OUTPUT, readme_example


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
