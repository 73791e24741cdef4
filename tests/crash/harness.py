"""Run a scenario against a real ``turnstile serve``, crashing it at one commit point.

One run (:func:`run_point`):

1. a fresh store (:mod:`tests.crash.stores`); ``turnstile serve`` on it with
   ``TURNSTILE_STORE_FAULT=crash-before:N`` or ``crash-after:N`` (:mod:`runtime.store.faults`);
2. the scenario drives it over HTTP like a client (:class:`Client`); when the process dies (the
   fault stopped it: exit status :data:`faults.CRASH_EXIT`), the harness starts it again on
   the same store without the fault and the scenario drives it again from the start: every
   request it sends is one a real client would re-send (the same idempotency key, the same
   session to create), so what the first attempt stored counts once;
3. once the store says the scenario is over (:meth:`Scenario.settled`), the node is stopped
   gracefully and the store is read directly (read-only) and checked
   (:mod:`tests.crash.invariants`), with the scenario's own checks.

:func:`count_points` runs the scenario once with the fault ``count``: how many writes it makes,
i.e. how many commit points there are to crash at (a batch of SQLite's group commit holds
several: the crash hits the commit that holds write N).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.crash.invariants import Record, check
from tests.crash.stores import Snapshot, Target, fresh_target
from turnstile.runtime.store import faults

TOKEN = "crash-harness-token-0123456789"
OWNER = "dev"
#: a hang bound: a webhook target the dead node claimed waits 30 s for the sweep
SETTLE_SECONDS = 60.0
WHERES = ("crash-before", "crash-after")
#: the fault ``fail:N`` (the commit fails, the node lives on): ``--fault fail``
FAIL = ("fail",)
#: the fault ``delay:N:seconds`` (the commit waits, the node lives on): ``--fault delay``
DELAY = ("delay",)
#: how long a delayed commit waits: past a request's usual answer, within every timeout
DELAY_SECONDS = 2.0
#: one node id for every start: the restarted node is a later epoch of the crashed one, so it
#: closes the crashed node's turns at once (another id would wait out its lease on PostgreSQL)
NODE_CONFIG = '[node]\nid = "crash-node"\n'


class ServerGone(Exception):
    """The node stopped answering (it died, or it is dying): start it again and re-drive.

    Attributes:
        status: its exit status, when it is known to have exited.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Client:
    """A client of one node over HTTP, as the dev user; a dead node is :class:`ServerGone`."""

    def __init__(self, url: str, record: Record, target: Target | None = None) -> None:
        self.url = url
        self.record = record
        #: the store, for a scenario that waits for something no answer tells (read-only)
        self.target = target
        #: the node's process, to tell a wait that it died (set by the harness)
        self.process: trio.Process | None = None
        self.http = httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )

    async def request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200, 201, 202, 204), **kw: Any
    ) -> httpx.Response:
        """``method path``; an answer outside ``ok`` is an AssertionError (a violation)."""
        try:
            response = await self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ServerGone(f"{method} {path}: {exc!r}") from None
        if response.status_code >= 500:
            # a node whose store went away mid-request answers 5xx, then dies: tell it apart
            raise ServerGone(f"{method} {path}: {response.status_code} {response.text[:200]}")
        if response.status_code not in ok:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response

    async def create_session(self, name: str) -> None:
        """Create session ``name`` (already there after a crash: ``already_exists``, fine)."""
        response = await self.request("POST", "/sessions", json={"id": name}, ok=(201, 400))
        if response.status_code == 400 and response.json()["error"]["code"] != "already_exists":
            raise AssertionError(f"POST /sessions: 400 {response.text[:300]}")

    async def send(self, name: str, content: str, key: str) -> int:
        """A message with an idempotency key; answers its input id, recorded as acknowledged."""
        response = await self.request(
            "POST",
            f"/sessions/{name}/messages",
            json={"content": content},
            headers={"Idempotency-Key": key},
        )
        input_id = response.json()["input_id"]
        self.record.acked[(f"{OWNER}/{name}", f"client:{key}")].add(input_id)
        return input_id

    async def wait_for(self, what: Callable[[Snapshot], bool], seconds: float = 20.0) -> bool:
        """Poll the store until ``what`` holds in it (True) or ``seconds`` passed (False)."""
        assert self.target is not None
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerGone(f"the node exited ({self.process.returncode}) while waiting")
            if what(await self.target.snapshot()):
                return True
            await trio.sleep(0.2)
        return False

    async def aclose(self) -> None:
        await self.http.aclose()


class Scenario:
    """What a crash run does: subclasses say how to drive the node and when it is over."""

    name = "scenario"
    #: about how many commit points a run has (the sample draws among them; the full form
    #: counts them): a point past the end crashes nothing and is checked all the same
    points = 20
    #: more of the node's TOML config (after :data:`NODE_CONFIG`)
    config: str = ""
    #: the scenario has a :meth:`setup`, run on a node without a fault before the crash run
    has_setup: bool = False
    #: a violation it finds that is reported and not fixed yet (docs/reliability.md): the
    #: suite's sample leaves the scenario out while this is set; the command line runs it
    known_violation: str = ""
    #: set by the harness with the fault ``fail:N``: a commit was refused (the node lived
    #: on), so a turn whose write it was may end ``failed``, a typed outcome, not a violation
    refused_commits: bool = False

    async def setup(self, client: Client) -> None:
        """What a node without a fault makes first (the crash points are those of the node
        started after it): e.g. a job due later, which :meth:`prepared` then makes due now."""

    async def prepared(self, target: Target) -> None:
        """Change the store between the setup node and the crash run (no node runs)."""

    async def drive(self, client: Client) -> None:
        """Send everything the scenario sends, from the start (again after a crash: it must
        re-send only what a real client would, with the same keys)."""
        raise NotImplementedError

    def settled(self, snap: Snapshot) -> bool:
        """The scenario is over in ``snap``: by default no input waits or runs."""
        return all(row["state"] not in ("queued", "running") for row in snap["inbox"])

    def check(self, snap: Snapshot, record: Record) -> list[str]:
        """Violations of the scenario's own expectations (beyond the invariants)."""
        return []


class _SetupPhase(Scenario):
    """A scenario's :meth:`Scenario.setup`, driven as a scenario of its own."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.name = scenario.name
        self.config = scenario.config

    async def drive(self, client: Client) -> None:
        await self.scenario.setup(client)


async def _set_up(target: Target, workdir: Path, scenario: Scenario, record: Record) -> list[str]:
    """Run ``scenario``'s setup on a node without a fault, then :meth:`Scenario.prepared`;
    answers what went wrong (a violation: the crash run did not happen as meant)."""
    if not scenario.has_setup:
        return []
    status = await _attempt(target, workdir, _SetupPhase(scenario), record, {faults.ENV: ""})
    if status is not None:
        return [f"the setup node died with status {status}"]
    await scenario.prepared(target)
    return []


@dataclass
class Outcome:
    """How one run went."""

    scenario: str
    store: str
    where: str
    point: int
    crashed: bool = False
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: the operation at the crash point, from the counting run's log (when known)
    operation: str = ""

    def describe(self) -> str:
        at = f"{self.where}:{self.point}" + (f" ({self.operation})" if self.operation else "")
        return f"{self.scenario} on {self.store} at {at}"


class Node:
    """One ``turnstile serve`` process on ``target`` (its stderr kept in ``log``)."""

    def __init__(self, process: trio.Process, url: str) -> None:
        self.process = process
        self.url = url


@asynccontextmanager
async def serving(
    target: Target,
    workdir: Path,
    scenario: Scenario,
    env: dict[str, str],
    node: str = "crash-node",
    lease_seconds: float | None = None,
) -> AsyncIterator[Node]:
    """``turnstile serve`` on ``target`` with ``env`` added, as node id ``node``; killed on
    exit if still running."""
    config = workdir / f"{scenario.name}-{node}.toml"
    lease = "" if lease_seconds is None else f"lease_seconds = {lease_seconds}\n"
    config.write_text(NODE_CONFIG.replace("crash-node", node) + lease + scenario.config)
    args = ["--port", "0", "--store", target.url, "--dev-token", TOKEN, "--config", str(config)]
    command = [sys.executable, "-m", "turnstile.actors.cli", "serve", *args]
    log = os.open(workdir / "serve.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        process = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **env}
        )
    finally:
        os.close(log)
    try:
        buffer = b""
        with trio.fail_after(60):
            while b"serving on " not in buffer:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    status = await process.wait()
                    raise ServerGone(f"serve exited ({status}) before serving", status)
                buffer += chunk
        yield Node(process, buffer.split(b"serving on ")[1].split()[0].decode())
    finally:
        if process.returncode is None:
            with trio.CancelScope(shield=True):
                process.kill()
                await process.wait()


async def _settle(target: Target, scenario: Scenario, node: Node) -> Snapshot:
    """Poll the store until the scenario is over; ServerGone if the node dies meanwhile."""
    deadline = trio.current_time() + SETTLE_SECONDS
    while True:
        if node.process.returncode is not None or node.process.poll() is not None:
            raise ServerGone(f"serve exited ({node.process.returncode}) while settling")
        snap = await target.snapshot()
        if scenario.settled(snap):
            return snap
        if trio.current_time() > deadline:
            raise TimeoutError("the scenario did not settle")
        await trio.sleep(0.2)


#: re-drives of a scenario on a node that answered 5xx and lives on (a failed commit)
RETRIES = 5


async def _drive(target: Target, scenario: Scenario, record: Record, node: Node) -> int | None:
    """Drive the scenario on ``node`` and wait until it settles: None, or the exit status of
    the node if it died meanwhile. A node that answered 5xx and is still alive a few seconds
    later (a commit failed, the fault ``fail:N``) is driven again from the start, as a client
    re-sends what was refused, up to :data:`RETRIES` times."""
    for _ in range(RETRIES + 1):
        client = Client(node.url, record, target)
        client.process = node.process
        try:
            await scenario.drive(client)
            await _settle(target, scenario, node)
            return None
        except ServerGone:
            with trio.move_on_after(5):
                return await node.process.wait()
            await trio.sleep(0.5)  # alive: a refused request, re-sent like a client would
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
    raise TimeoutError(f"the node still refused after {RETRIES} re-sends")


async def _stop(node: Node) -> int | None:
    """Stop ``node`` gracefully: None, or its exit status if that was not 0."""
    node.process.send_signal(signal.SIGTERM)
    with trio.fail_after(60):
        status = await node.process.wait()
    return None if status == 0 else status  # (CRASH_EXIT: it crashed while stopping)


async def _attempt(
    target: Target, workdir: Path, scenario: Scenario, record: Record, env: dict[str, str]
) -> int | None:
    """Start a node, drive the scenario and wait until it settles, then stop the node
    gracefully. Answers None when that went through, else the dead node's exit status."""
    try:
        async with serving(target, workdir, scenario, env) as node:
            died = await _drive(target, scenario, record, node)
            if died is not None:
                return died
            return await _stop(node)
    except ServerGone as exc:  # it died while starting
        assert exc.status is not None
        return exc.status


#: the lease of the nodes of a survivor run: the survivor takes over when it expired
SURVIVOR_LEASE_SECONDS = 3.0


async def _attempt_with_survivor(
    target: Target, workdir: Path, scenario: Scenario, record: Record, env: dict[str, str]
) -> tuple[int | None, list[str]]:
    """Two nodes on one (PostgreSQL) store: the node with ``env``'s fault, which the scenario
    drives, and, once it died, the survivor, another node id that starts while the dead one's
    lease (:data:`SURVIVOR_LEASE_SECONDS`) still runs: the client goes to the survivor and
    drives the scenario again from the start, and the survivor's sweep declares the dead node
    dead when its lease expired and takes over what it held. The dead node is not started
    again. Started after the crash, not before, so that the faulty node is the only one to
    fire the scenario's due job and hold its session: every commit point is one of the work
    the survivor then takes over. Answers the dead node's exit status (None if it did not
    die) and what went wrong with the survivor."""
    problems: list[str] = []
    lease = SURVIVOR_LEASE_SECONDS
    try:
        async with serving(target, workdir, scenario, env, "crash-node", lease) as node:
            died = await _drive(target, scenario, record, node)
            if died is None:
                died = await _stop(node)
    except ServerGone as exc:  # it died while starting
        assert exc.status is not None
        died = exc.status
    if died is None:
        return None, problems
    async with serving(
        target, workdir, scenario, {faults.ENV: ""}, "crash-survivor", lease
    ) as survivor:
        again = await _drive(target, scenario, record, survivor)
        if again is not None:
            problems.append(f"the survivor died with status {again}")
            return died, problems
        status = await _stop(survivor)
        if status is not None:
            problems.append(f"the survivor stopped with status {status}")
    return died, problems


async def run_point(
    scenario: Scenario,
    kind: str,
    where: str,
    point: int,
    workdir: Path,
    pg_dsn: str | None = None,
    survivor: bool = False,
) -> Outcome:
    """Crash ``scenario`` on a fresh ``kind`` store at commit ``point`` (``where``: before or
    after it), restart, finish, and check (see the module docstring). With ``survivor``
    (PostgreSQL), a second node finishes in place of the crashed one, which does not come
    back (:func:`_attempt_with_survivor`)."""
    outcome = Outcome(scenario.name, kind + ("+survivor" if survivor else ""), where, point)
    started = time.monotonic()
    record = Record()
    async with fresh_target(kind, workdir, pg_dsn) as target:
        run_dir = workdir / f"{scenario.name}-{outcome.store}-{where}-{point}"
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            outcome.violations += await _set_up(target, run_dir, scenario, record)
            spec = f"{where}:{point}" + (f":{DELAY_SECONDS:g}" if where == "delay" else "")
            fault = {faults.ENV: spec}
            scenario.refused_commits = where == "fail"
            if survivor:
                status, problems = await _attempt_with_survivor(
                    target, run_dir, scenario, record, fault
                )
                outcome.violations += problems
                if status is not None and status != faults.CRASH_EXIT:
                    outcome.violations.append(f"the node died with status {status}, not the fault")
                outcome.crashed = status is not None
            else:
                status = await _attempt(target, run_dir, scenario, record, fault)
                if where == "fail":  # the node lives on: "crashed" says the commit failed
                    outcome.crashed = "injected fault" in _log(run_dir)
                elif where == "delay":  # the node lives on: "crashed" says the commit waited
                    outcome.crashed = f"store fault delay:{point}:" in _log(run_dir)
            if status is not None and not survivor:
                if where == "fail" and "turnstile: cannot start:" in _log(run_dir):
                    pass  # a refused commit while starting: it says so and exits, to be restarted
                elif status != faults.CRASH_EXIT:
                    outcome.violations.append(f"the node died with status {status}, not the fault")
                outcome.crashed = True
                again = await _attempt(target, run_dir, scenario, record, {faults.ENV: ""})
                if again is not None:
                    outcome.violations.append(f"the restarted node died with status {again}")
        except (TimeoutError, trio.TooSlowError) as exc:
            outcome.violations.append(f"{exc}; see {run_dir}/serve.log")
        except AssertionError as exc:
            outcome.violations.append(f"a client was answered wrongly: {exc}")
        snap = await target.snapshot()
        outcome.violations += check(snap, record) + scenario.check(snap, record)
        if outcome.violations:
            (run_dir / "snapshot.json").write_text(json.dumps(snap.tables, default=str, indent=1))
    outcome.seconds = time.monotonic() - started
    return outcome


def _log(run_dir: Path) -> str:
    """What the run's nodes wrote to stderr."""
    path = run_dir / "serve.log"
    return path.read_text(errors="replace") if path.exists() else ""


async def count_points(
    scenario: Scenario, kind: str, workdir: Path, pg_dsn: str | None = None
) -> tuple[list[str], list[str]]:
    """Run ``scenario`` once without a crash, counting its writes: (the operation of each
    commit point, in order; the violations of that run, which should be none)."""
    record = Record()
    run_dir = workdir / f"{scenario.name}-{kind}-count"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "writes.log"
    violations: list[str] = []
    async with fresh_target(kind, workdir, pg_dsn) as target:
        env = {faults.ENV: "count", faults.LOG_ENV: str(log)}
        try:
            violations += await _set_up(target, run_dir, scenario, record)
            status = await _attempt(target, run_dir, scenario, record, env)
            if status is not None:
                violations.append(f"the node died with status {status} without a fault")
        except (TimeoutError, trio.TooSlowError) as exc:
            violations.append(f"{exc}; see {run_dir}/serve.log")
        snap = await target.snapshot()
        violations += check(snap, record) + scenario.check(snap, record)
    names = [line.split(" ", 1)[1] for line in log.read_text().splitlines()] if log.exists() else []
    return names, violations


async def run_many(
    jobs: list[Callable[[], Awaitable[Outcome]]],
    parallel: int,
    on_done: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Run ``jobs`` ``parallel`` at a time; their outcomes in order."""
    results: list[Outcome | None] = [None] * len(jobs)
    limit = trio.CapacityLimiter(parallel)

    async def one(i: int) -> None:
        async with limit:
            results[i] = await jobs[i]()
        if on_done is not None:
            on_done(results[i])  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        for i in range(len(jobs)):
            nursery.start_soon(one, i)
    return [r for r in results if r is not None]
