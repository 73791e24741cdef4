"""The tests mirror the packages: ``tests/runtime/`` holds tests of the kernel (``runtime/``),
``tests/tools/`` tests of the tool system (``tools/``), and a feature's tests live in
``tests/actors/<feature>/``. A module under ``tests/runtime`` or ``tests/tools`` that imports a
feature (``turnstile.actors.*``, or a feature's test helpers in ``tests.actors``) tests that
feature and belongs in its folder; move it there rather than widening ``ALLOWED``.

Only imports are read (the module's own, at any depth, ``TYPE_CHECKING`` included), and dotted
strings naming a feature module (``monkeypatch.setattr("turnstile.actors.x.y", ...)``,
``importlib.import_module``): what ``tests.support`` pulls in is the helper's business.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
KERNEL_FOLDERS = ("runtime", "tools")
FEATURE_PREFIXES = ("turnstile.actors", "tests.actors")

# path relative to tests/ -> feature modules it may import, each with the reason. Empty: no
# kernel or tool test needs a feature today.
ALLOWED: dict[str, set[str]] = {}


def is_feature(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in FEATURE_PREFIXES)


def feature_imports(source: str) -> list[str]:
    """The feature modules a test module's source names, in order, each once."""
    found: list[str] = []

    def add(name: str) -> None:
        if is_feature(name) and name not in found:
            found.append(name)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if is_feature(node.module):
                add(node.module)
            else:  # from turnstile import actors; from tests import actors
                for alias in node.names:
                    add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if " " not in node.value:
                add(node.value)
    return found


def kernel_test_modules() -> list[Path]:
    return sorted(p for folder in KERNEL_FOLDERS for p in (TESTS / folder).rglob("*.py"))


@pytest.mark.parametrize(
    "path", kernel_test_modules(), ids=lambda p: p.relative_to(TESTS).as_posix()
)
def test_kernel_and_tool_tests_import_no_feature(path: Path):
    rel = path.relative_to(TESTS).as_posix()
    allowed = ALLOWED.get(rel, set())
    extra = [m for m in feature_imports(path.read_text()) if m not in allowed]
    assert not extra, (
        f"tests/{rel} imports {', '.join(extra)}: it tests a feature, so it belongs in "
        "tests/actors/<feature>/ (tests/runtime and tests/tools hold tests of runtime/ and "
        "tools/ only)"
    )


def test_every_allowance_names_a_module_that_exists_and_still_needs_it():
    for rel, modules in ALLOWED.items():
        path = TESTS / rel
        assert path.is_file(), f"ALLOWED names tests/{rel}, which is gone"
        unused = modules - set(feature_imports(path.read_text()))
        assert not unused, f"tests/{rel} no longer imports {sorted(unused)}: drop them"


def test_the_check_sees_every_way_of_naming_a_feature():
    source = """
import turnstile.actors.watchers.safeexpr as safeexpr
from turnstile.actors.scheduling.cronexpr import parse
from turnstile import actors
from tests.actors.sessions.test_anynode import Cluster
from turnstile.runtime.clock import Clock
from tests.support.polling import eventually

def later(monkeypatch):
    from turnstile.actors.node import make_agent
    monkeypatch.setattr("turnstile.actors.memory.service.Memory.start", None)
    return "see turnstile.actors.node for the start order"
"""
    assert sorted(feature_imports(source)) == sorted(
        [
            "turnstile.actors.watchers.safeexpr",
            "turnstile.actors.scheduling.cronexpr",
            "turnstile.actors",
            "tests.actors.sessions.test_anynode",
            "turnstile.actors.node",
            "turnstile.actors.memory.service.Memory.start",
        ]
    )


def test_the_kernel_folders_hold_tests():
    """The check reads something: a renamed folder would leave it passing on nothing."""
    names = {
        p.relative_to(TESTS).parts[0] for p in kernel_test_modules() if p.name.startswith("test_")
    }
    assert names == set(KERNEL_FOLDERS)
