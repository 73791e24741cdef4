"""The kernel names no feature's tables (DESIGN.md: "Nothing in it names a feature").

Import contracts (``scripts/lint-imports.sh``) keep ``runtime/`` from importing a feature; this
keeps its SQL and its store API from naming one: scheduling's tables (``jobs``, ``job_runs``,
the one-pending-recall index) and records moved to ``actors/scheduling/`` and must not come
back. The kernel's migration step 2 keeps its recorded name, ``one_pending_recall`` (the
runner compares a recorded step's name), and makes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

RUNTIME = Path(__file__).parents[2] / "runtime"
#: SQL on scheduling's tables, and the names of its records and operations.
FORBIDDEN = re.compile(
    r"\b(FROM|INTO|UPDATE|JOIN|TABLE|ON|REFERENCES)\s+(jobs|job_runs)\b"
    r"|\bjob_runs\b|\bjobs_\w+_idx\b"
    r"|\b(Job|JobRun|FireRequest|FireResult|JOB_STATES|RUN_STATES)\b"
    r"|\b(create_job|get_job|list_jobs|update_job|delete_job|due_jobs|fire_job|fire_jobs"
    r"|list_runs|get_run|update_run)\b"
    r"|(?i:recall)",
)
#: The one mention left, and why: kernel step 2's recorded name.
ALLOWED = {("store/kernel.py", 'Migration(2, "one_pending_recall", ())')}


@pytest.mark.parametrize(
    "path", sorted(RUNTIME.rglob("*.py")), ids=lambda p: p.relative_to(RUNTIME).as_posix()
)
def test_the_kernel_names_no_job_table_or_record(path: Path):
    rel = path.relative_to(RUNTIME).as_posix()
    found = [
        f"{rel}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FORBIDDEN.search(line) and (rel, line.strip().rstrip(",")) not in ALLOWED
    ]
    assert not found, "the kernel names scheduling's tables or records:\n" + "\n".join(found)
