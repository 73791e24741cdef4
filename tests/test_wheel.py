"""The built wheel installs one top-level package, ``turnstile``, and works without the repository.

pyproject.toml maps the repository's folders onto ``turnstile.*`` (``runtime/`` installs as
``turnstile.runtime``, ...) with an explicit package list, so a new package folder that is not
added to that list is silently left out of the wheel while every test run from the checkout (an
editable install) still passes. These tests build the wheel and use it the way a user would:

* the wheel holds only ``turnstile/`` and its ``.dist-info`` — no top-level ``runtime/``,
  ``tools/``, ``actors/``, ``bench/`` or ``tests/`` — and every folder with an ``__init__.py``
  under ``runtime/``, ``tools/``, ``actors/`` and ``turnstile/`` is in it;
* installed into a fresh virtual environment, the ``turnstile`` console script runs, and every
  module of the installed package imports from that environment, from a working directory whose
  decoy ``runtime``/``tools``/``actors`` packages raise ImportError when imported (so nothing
  still imports the old top-level names, and nothing comes from the repository).

How it is built and installed, and why:

* The wheel is built from a copy of the working tree in tmp_path, not from the repository
  itself: setuptools builds in-tree, and its ``build/lib`` keeps modules from earlier builds
  (deleted or renamed ones included) and puts them in the next wheel, which could hide exactly
  what this test looks for; it would also leave ``build/`` behind in a tree others work in.
* ``pip wheel --no-build-isolation``: no download of the build backend, using the dev venv's
  setuptools (>= 77 for the PEP 639 ``license`` field; the ``dev`` extra asks for it).
* The environment is clean: ``python -m venv`` without ``--system-site-packages``, and the wheel
  is installed with its dependencies from the package index by the dev venv's uv (``uv pip
  install --python``, which needs no pip in the new venv). pip took 40-50 s of a 2-core box's
  CPU for it inside a full suite run; uv, from its cache, a few seconds. Without a reachable
  index the install fails, with uv's output in the failure.

Later tests (a README example, say) can reuse the ``installed`` fixture and
:func:`run_in_installed`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.support.readme import EXPECTED_OUTPUT, readme_example

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

#: Repository folder -> the package it installs as (pyproject's [tool.setuptools.package-dir]).
INSTALLED_AS = {
    "turnstile": "turnstile",
    "runtime": "turnstile.runtime",
    "tools": "turnstile.tools",
    "actors": "turnstile.actors",
    "protocol": "turnstile.protocol",
    "client": "turnstile.client",
}

#: Top-level names that must never be in the wheel.
NOT_INSTALLED = {"runtime", "tools", "actors", "protocol", "client", "bench", "tests"}

#: Not copied for the build: VCS data, environments, build output, caches, scratch space.
_SKIP_AT_ROOT = {".git", ".venv", "venv", "build", "dist", "workspace"}
_SKIP_ANYWHERE = {"__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".mypy_cache"}

#: What a command in the installed environment must not inherit from the one running the tests.
_LEAKY_ENV = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "VIRTUAL_ENV"}


@dataclass(frozen=True)
class Installed:
    venv: Path  #: the fresh virtual environment holding the wheel
    wheel: Path  #: the built wheel file
    source: Path  #: the copy of the working tree the wheel was built from
    decoys: Path  #: a working directory with decoy runtime/, tools/, actors/ packages
    build_output: str  #: what building the wheel printed (pip's stdout and stderr)


def venv_bin(venv: Path, name: str) -> Path:
    """An executable (``python``, a console script) of ``venv``."""
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def clean_env() -> dict[str, str]:
    """This process's environment without what would point Python at another environment."""
    return {k: v for k, v in os.environ.items() if k not in _LEAKY_ENV}


def run_in_installed(venv: Path, code: str, cwd: Path, timeout: float = 120) -> str:
    """Run Python ``code`` with ``venv``'s interpreter in ``cwd``; return its stdout.

    ``python -c`` puts ``cwd`` first on sys.path, like a user's script next to their files:
    from the ``installed`` fixture's ``decoys`` directory, importing a top-level ``runtime``,
    ``tools`` or ``actors`` raises ImportError("decoy"). ``code`` is dedented. Fails the test
    with the output when the interpreter exits non-zero.
    """
    result = subprocess.run(
        [str(venv_bin(venv, "python")), "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        pytest.fail(
            f"python -c in {venv} (cwd {cwd}) exited {result.returncode}\n"
            f"--- code ---\n{textwrap.dedent(code)}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
    return result.stdout


def _run(cmd: list[str], *, what: str, timeout: float) -> str:
    result = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {result.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
    return result.stdout + result.stderr


def _copy_source(destination: Path) -> Path:
    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in _SKIP_ANYWHERE or n.endswith((".egg-info", ".pyc"))}
        if Path(folder) == REPO:
            skip |= _SKIP_AT_ROOT & set(names)
        return skip

    shutil.copytree(REPO, destination, ignore=ignore)
    return destination


def _decoy_directory(destination: Path) -> Path:
    for name in ("runtime", "tools", "actors", "protocol", "client"):
        package = destination / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f'raise ImportError("decoy: the top-level {name!r} package was imported")\n'
        )
    return destination


# Session scope: under pytest-xdist a worker can run other modules' tests between this module's,
# and a module-scoped fixture is torn down at each change of module: at load 8 the wheel was
# built and installed three times.
@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, built from a copy of the working tree and installed into a fresh venv."""
    setuptools = version("setuptools")
    if int(setuptools.split(".")[0]) < 77:
        pytest.fail(
            f"the dev venv has setuptools {setuptools}; building the wheel without build "
            "isolation needs >= 77 (run: bash scripts/venv.sh dev)"
        )
    root = tmp_path_factory.mktemp("wheel")
    source = _copy_source(root / "source")
    dist = root / "dist"
    build_output = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(dist), str(source)],
        what="building the wheel", timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], what="venv", timeout=120)
    _run(
        [sys.executable, "-m", "uv", "pip", "install", "--python", str(venv_bin(venv, "python")),
         "--quiet", str(wheel)],
        what="installing the wheel with its dependencies", timeout=600,
    )  # fmt: skip
    return Installed(venv, wheel, source, _decoy_directory(root / "decoys"), build_output)


def test_building_the_wheel_prints_no_warning(installed):
    """setuptools warns (fifty lines, at every build, on a user's first ``serve.sh``) about any
    folder under a package that is not listed in ``packages``, the console's ``static/`` once."""
    warnings = re.findall(r"\b\w+Warning\b.*", installed.build_output)
    assert not warnings, installed.build_output


def test_the_wheel_holds_the_console_files(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    static = REPO / "actors" / "console" / "static"
    shipped = {p.name for p in static.iterdir() if p.is_file()}
    prefix = "turnstile/actors/console/static/"
    assert {n.removeprefix(prefix) for n in names if n.startswith(prefix)} == shipped


def test_the_wheel_holds_turnstile_and_every_package_folder(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names}
    assert not top_level & NOT_INSTALLED, f"top-level entries that must not ship: {top_level}"
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"turnstile"}, top_level

    missing = []
    for folder, package in INSTALLED_AS.items():
        for init in sorted((installed.source / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(installed.source / folder)
            in_wheel = Path(*package.split("."), relative, "__init__.py").as_posix()
            if in_wheel not in names:
                dotted = ".".join((package, *relative.parts))
                missing.append(f"{init.parent.relative_to(installed.source)}/ ({dotted})")
    assert not missing, (
        "package folders missing from the wheel; add them to [tool.setuptools] packages in "
        f"pyproject.toml: {missing}"
    )


def test_the_console_script_runs_from_the_installed_environment(installed):
    result = subprocess.run(
        [str(venv_bin(installed.venv, "turnstile")), "serve", "--help"],
        cwd=installed.decoys,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stdout.startswith("usage: turnstile serve"), result.stdout
    assert "--port" in result.stdout, result.stdout


def test_bench_says_it_needs_a_checkout_when_installed(installed):
    """bench/ is not in the wheel: ``turnstile bench`` says so instead of a traceback."""
    result = subprocess.run(
        [str(venv_bin(installed.venv, "turnstile")), "bench", "--quick"],
        cwd=installed.decoys,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "not installed with the package" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_installed_module_imports_from_the_installed_environment(installed):
    report = json.loads(
        run_in_installed(
            installed.venv,
            """
            import importlib, json, os, pkgutil, sys

            import turnstile

            def fail(name):
                raise  # pkgutil calls this while handling the import's exception: show it

            names = ["turnstile"] + [
                info.name
                for info in pkgutil.walk_packages(turnstile.__path__, "turnstile.", onerror=fail)
            ]
            files = {}
            for name in names:
                files[name] = os.path.realpath(importlib.import_module(name).__file__)
            print(json.dumps({
                "prefix": os.path.realpath(sys.prefix),
                "files": files,
                "old_names": sorted(
                    m
                    for m in sys.modules
                    if m.split(".")[0] in ("runtime", "tools", "actors", "protocol", "client")
                ),
            }))
            """,
            cwd=installed.decoys,
        )
    )
    venv = str(installed.venv.resolve())
    assert report["prefix"] == venv
    outside = {n: f for n, f in report["files"].items() if not f.startswith(venv + os.sep)}
    assert not outside, f"modules imported from outside the new venv {venv}: {outside}"
    assert not report["old_names"], f"old top-level names imported: {report['old_names']}"

    expected = set()
    for folder, package in INSTALLED_AS.items():
        for module in (installed.source / folder).rglob("*.py"):
            relative = module.relative_to(installed.source / folder).with_suffix("")
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            if all((installed.source / folder / Path(*relative.parts[:i]) / "__init__.py").exists()
                   for i in range(len(relative.parts))):  # fmt: skip
                expected.add(".".join((package, *parts)))
    missing = sorted(expected - set(report["files"]))
    assert not missing, f"modules of the source tree not importable from the wheel: {missing}"


def test_the_readme_example_runs_from_the_installed_environment(installed):
    # From the decoys directory: the example imports nothing but ``turnstile`` and its
    # dependencies, all from the new venv (it leaves its SQLite file and workspace there).
    output = run_in_installed(installed.venv, readme_example(), cwd=installed.decoys, timeout=60)
    assert output == EXPECTED_OUTPUT
