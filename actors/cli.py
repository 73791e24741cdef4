"""The ``turnstile`` command.

* ``serve`` — run a node (store, session actors, gateway) until Ctrl-C / SIGTERM.
* ``attach SESSION`` — a terminal client: type messages, watch turns stream (on
  ``turnstile.client``, ``client/terminal.py``).
* ``sessions`` — list your sessions.
* ``jobs [list|show|pause|resume|cancel]``, ``watchers [list|show|pause|resume|stop]`` — your
  scheduled jobs and watchers, from a running node.
* ``bench`` — run benchmark scenarios.
* ``memory list | search | put | forget | summary | extraction | delete-all | changes | watch``
  — a user's long-term memory, from a running node.
* ``memory backfill`` — embed the memory facts that have no embedding (``docs/memory.md``).
* ``nodes`` — the nodes sharing the config's store, alive or dead (``docs/cluster.md``).

Exit status, for every command: 0 done; 2 a wrong command line, a bad config, or a request
the node refused (a 4xx: a bad token, nothing by that id, a bad value); 1 the node (or the
store) could not be reached or failed (a 5xx, a timeout); ``serve`` also exits 3 when the node
lost its place among the nodes (``docs/cluster.md``). ``--json`` prints the answer as JSON
(indented) instead of a table, on every command that lists or changes something.

The commands that talk to a running node (``attach``, ``sessions``, ``jobs``, ``watchers``,
``memory`` but ``backfill``) are built on ``turnstile.client``: ``client/terminal.py`` and
``client/commands/``, one module per command group; this module parses their command lines
and calls them.

The CLI is the program's entry point: with the composition root (``actors.node``) it is the one
module allowed to know every feature (an import contract). It imports ``actors.node`` lazily,
inside ``serve``, so ``attach`` and the clients start without loading the features.

It is over 400 lines because it is the one command line: one parser and a short handler per command;
the import contract lets only this module and the composition root know every feature, so the
commands are not spread over the features.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Iterator

import msgspec
import trio

from turnstile.actors.config import Config, load_config
from turnstile.runtime.errors import DecodeError, LeaseLost, TurnstileError
from turnstile.runtime.taskdump import dump_on_signal

__all__ = ["main"]

DEFAULT_URL = "http://127.0.0.1:8765"


def _tokens(config: Config, dev_token: str | None) -> tuple[dict[str, str], str | None]:
    """Token → user from the config, plus a dev user; generates a token when there is none."""
    tokens = {user.token: user.name for user in config.users}
    generated = None
    dev_token = dev_token or os.environ.get("TURNSTILE_DEV_TOKEN")
    if dev_token:
        tokens[dev_token] = "dev"
    elif not tokens:
        generated = secrets.token_urlsafe(24)
        tokens[generated] = "dev"
    return tokens, generated


async def _drain(node, seconds: float, signals) -> None:
    """Drain before stopping (``Node.drain``); a second signal stops at once."""
    print(
        f"turnstile draining: up to {seconds:g} s for the turns running here"
        " (signal again to stop now)",
        file=sys.stderr,
    )
    async with trio.open_nursery() as nursery:

        async def again() -> None:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return

        nursery.start_soon(again)
        done = await node.drain(seconds)
        print("turnstile drained" if done else "turnstile drain: time is up", file=sys.stderr)
        nursery.cancel_scope.cancel()


def _serve(args: argparse.Namespace) -> int:
    from turnstile.actors.node import open_node
    from turnstile.runtime.server import tune_gc

    try:
        config = load_config(args.config)
    except (DecodeError, OSError) as exc:
        print(f"turnstile: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    overrides = {
        k: v
        for k, v in {
            "host": args.host,
            "port": args.port,
            "store": args.store,
            "agent": args.agent,
        }.items()
        if v is not None
    }
    config = msgspec.structs.replace(config, **overrides)
    if args.token_delay is not None:
        config.scripted.token_delay = args.token_delay
    tokens, generated = _tokens(config, args.dev_token)
    tune_gc()
    # SIGUSR1 dumps the task tree while serving; before and after that its default would
    # end the process, so it is ignored there (trio restores this when its receiver closes)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    async def run() -> None:
        # SIGINT and SIGTERM both mean "shut down gracefully": stop the gateway, then the
        # actors (their on_stop runs), then close the store.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with open_node(config, tokens=tokens) as node, trio.open_nursery() as dumps:
                dumps.start_soon(dump_on_signal)  # SIGUSR1: what every task waits on
                gc.freeze()  # what start-up built lives for the whole run
                print(
                    f"turnstile serving on {', '.join(node.urls)} "
                    f"(store {config.store}, agent {config.agent})",
                    flush=True,
                )
                if generated:
                    print(f"dev token (user 'dev'): {generated}", flush=True)
                async for signum in signals:
                    print(f"turnstile stopping ({signal.Signals(signum).name})", file=sys.stderr)
                    seconds = config.node.drain_seconds
                    if node.context.placement is not None and seconds > 0:
                        await _drain(node, seconds, signals)
                    break
                dumps.cancel_scope.cancel()

    try:
        trio.run(run)
    except (Exception, BaseExceptionGroup) as exc:
        lost = _find(exc, LeaseLost)
        if lost is not None:  # logged as critical already; the exit status says it too
            print(f"turnstile: stopped serving: {lost}", file=sys.stderr)
            return 3
        reason = _start_error(exc)
        if reason is None:
            raise
        print(f"turnstile: cannot start: {reason}", file=sys.stderr)
        return 2
    print("turnstile stopped", file=sys.stderr)
    return 0


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` itself or the first ``kind`` in it when it is a (nested) group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
        return None
    return exc if isinstance(exc, kind) else None


def _start_error(exc: BaseException) -> str | None:
    """A one-line reason for a configuration or environment problem, or None for a bug."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            reason = _start_error(inner)
            if reason is not None:
                return reason
        return None
    if isinstance(exc, TurnstileError | ValueError | OSError):
        field = getattr(exc, "field", None)
        return f"{exc} ({field})" if field else str(exc)
    return None


def _client_token(args: argparse.Namespace) -> str | None:
    """The bearer token (``--token``, else ``TURNSTILE_TOKEN``, else ``TURNSTILE_DEV_TOKEN``);
    None, said on stderr, when there is none."""
    token = args.token or os.environ.get("TURNSTILE_TOKEN") or os.environ.get("TURNSTILE_DEV_TOKEN")
    if not token:
        print(f"turnstile {args.command}: give --token or set TURNSTILE_TOKEN", file=sys.stderr)
    return token


@contextlib.contextmanager
def _requests_unlogged(args: argparse.Namespace) -> Iterator[None]:
    """httpx's INFO line per request silenced unless ``--verbose``: on a client's terminal a
    line per request would bury the answer."""
    httpx_log = logging.getLogger("httpx")
    level = httpx_log.level
    if not args.verbose:
        httpx_log.setLevel(logging.WARNING)
    try:
        yield
    finally:  # main() is also called in-process (tests, embedding): leave logging as found
        httpx_log.setLevel(level)


def _client(run):
    """A client command over ``run(args, token)`` (``client/commands/``): exit 2 without a
    token; httpx's line per request silenced unless ``--verbose``."""

    def command(args: argparse.Namespace) -> int:
        token = _client_token(args)
        if not token:
            return 2
        with _requests_unlogged(args):
            return run(args, token)

    return command


def _sessions(args: argparse.Namespace, token: str) -> int:
    from turnstile.client.commands.sessions import run_sessions

    return run_sessions(args, token)


def _jobs(args: argparse.Namespace, token: str) -> int:
    from turnstile.client.commands.jobs import run_jobs

    return run_jobs(args, token)


def _watchers(args: argparse.Namespace, token: str) -> int:
    from turnstile.client.commands.watchers import run_watchers

    return run_watchers(args, token)


def _memory(args: argparse.Namespace, token: str) -> int:
    """A ``turnstile memory`` command other than ``backfill``: a request to the node."""
    from turnstile.client.commands.memory import run_memory

    return run_memory(args, token)


def _attach(args: argparse.Namespace) -> int:
    from turnstile.client.terminal import attach

    token = _client_token(args)
    if not token:
        return 2
    with _requests_unlogged(args):  # attach without a session id creates one over HTTP
        return trio.run(attach, args.url, token, args.session, args.after_seq)


def _bench(args: argparse.Namespace) -> int:
    """Run the benchmark scenarios, which live in the repository's ``bench/`` folder: it is not
    installed with the package, so this runs from the root of a checkout."""
    checkout = os.getcwd()
    if os.path.isfile(os.path.join(checkout, "bench", "harness.py")) and checkout not in sys.path:
        sys.path.insert(0, checkout)
    try:
        from bench.harness import main as bench_main
    except ImportError:
        print(
            "turnstile bench: the benchmarks are not installed with the package; run it from "
            "the root of a checkout of the repository",
            file=sys.stderr,
        )
        return 2
    return bench_main(args.rest)


def _memory_backfill(args: argparse.Namespace) -> int:
    """Open the node's store with the memory tables and embed the facts that have no
    embedding, in batches; running it again finds nothing to do."""
    from turnstile.actors.memory.embeddings import EmbeddingError, resolve_embedder
    from turnstile.actors.memory.schema import MEMORY
    from turnstile.actors.memory.service import Memory
    from turnstile.runtime.clock import SystemClock
    from turnstile.runtime.store import open_store

    try:
        config = load_config(args.config)
    except (DecodeError, OSError) as exc:
        print(f"turnstile: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.batch_size is not None and args.batch_size < 1:
        print("turnstile memory backfill: --batch-size must be >= 1", file=sys.stderr)
        return 2
    store_url = args.store or config.store
    embedder = resolve_embedder(config.memory.embeddings, config.openai.get("base_url"))
    if embedder is None:
        print(
            "turnstile memory backfill: no embedder configured ([memory.embeddings] model)",
            file=sys.stderr,
        )
        return 2

    async def run() -> int:
        async with open_store(store_url, migrations=[MEMORY]) as store:
            memory = Memory(store, SystemClock(), config.memory, embedder)
            await memory.start()
            if memory.vector_path.kind == "none":
                reason = memory.vector_path.describe()
                print(f"turnstile memory backfill: no vector search: {reason}", file=sys.stderr)
                return 2
            try:
                counts = await memory.backfill(args.batch_size, everything=args.all)
            except EmbeddingError as exc:
                print(f"turnstile memory backfill: {exc}", file=sys.stderr)
                return 1
        print(
            f"embedded {counts['embedded']} facts; {counts['remaining']} without an embedding",
            flush=True,
        )
        return 0

    return trio.run(run)


def _nodes(args: argparse.Namespace) -> int:
    """List the nodes sharing the store the config names (or ``--store``): a table, or the
    store's answer as JSON with ``--json``. Alive or dead is the store's judgement, by the
    database clock on PostgreSQL."""
    from turnstile.runtime.store import open_store

    try:
        config = load_config(args.config)
    except (DecodeError, OSError) as exc:
        print(f"turnstile: bad config {args.config}: {exc}", file=sys.stderr)
        return 2

    async def run() -> int:
        async with open_store(args.store or config.store) as store:
            view = await store.list_nodes()
            clock = "the database's clock" if store.backend == "postgres" else "this host's clock"
        if args.json:
            print(json.dumps(msgspec.to_builtins(view), indent=2, ensure_ascii=False))
            return 0
        if not view.nodes:
            print("no node has registered with this store")
            return 0
        header = (
            "ID",
            "EPOCH",
            "STATE",
            "ALIVE",
            "STARTED",
            "LAST HEARTBEAT",
            "LEASE EXPIRES",
            "ADDRESS",
        )
        rows = [header] + [
            (
                node.id,
                str(node.epoch),
                node.state,
                "alive" if node.alive else "dead",
                _when(node.started_at),
                f"{_when(node.heartbeat_at)} ({_ago(view.now, node.heartbeat_at)})",
                _ago(view.now, node.lease_expires_at),
                node.address or "-",
            )
            for node in view.nodes
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            print(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                ).rstrip()
            )
        live = sum(node.alive for node in view.nodes)
        print(f"{live} alive of {len(view.nodes)} (as of {_when(view.now)}, by {clock})")
        return 0

    try:
        return trio.run(run)
    except (Exception, BaseExceptionGroup) as exc:
        reason = _start_error(exc)
        if reason is None:
            raise
        print(f"turnstile nodes: {reason}", file=sys.stderr)
        return 1


def _when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _ago(now, moment) -> str:
    """``moment`` relative to ``now``: ``3.2s ago`` or ``in 11.8s``."""
    seconds = (moment - now).total_seconds()
    return f"in {seconds:.1f}s" if seconds > 0 else f"{-seconds:.1f}s ago"


def _add_memory_commands(memory_sub: argparse._SubParsersAction) -> None:
    """``turnstile memory list | search | put | forget | summary | extraction | delete-all |
    changes | watch``."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", default=DEFAULT_URL, help=f"node URL (default {DEFAULT_URL})")
    client.add_argument("--token", help="bearer token (or TURNSTILE_TOKEN)")
    client.add_argument("--json", action="store_true", help="print the node's JSON answer")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        parser = memory_sub.add_parser(name, help=help, parents=[client])
        parser.set_defaults(func=_client(_memory))
        return parser

    sort_keys = ["category", "key", "value", "source", "confidence", "created_at", "updated_at"]
    listing = command("list", "list your facts, a page at a time")
    listing.add_argument("--search", help="only facts whose category, key or value holds this")
    listing.add_argument("--category", help="only this category")
    listing.add_argument("--sort", choices=sort_keys, help="sort by (default category)")
    listing.add_argument("--order", choices=["asc", "desc"], help="default desc")
    listing.add_argument("--limit", type=int, help="facts per page (default: the node's most)")
    listing.add_argument("--offset", type=int, help="skip this many (the next page's start)")
    listing.add_argument(
        "--all-users", action="store_true", help="every user's facts (memory.read_all only)"
    )

    search = command("search", "search your facts by meaning and by words, best first")
    search.add_argument("query")
    search.add_argument("--limit", type=int, help="at most this many (default 15)")

    put = command("put", "save a fact (replacing the one with the same category and key)")
    put.add_argument("category")
    put.add_argument("key")
    put.add_argument("value")
    put.add_argument(
        "--source",
        choices=["user_explicit", "conversation", "tool_call", "auto_discovery"],
        help="how it was learnt (default user_explicit)",
    )
    put.add_argument("--confidence", type=int, help="0-100 (default: by source)")
    put.add_argument("--expires-days", type=int, help="forget it after this many days")
    put.add_argument("--context", help="where it came from, in a few words")

    forget = command("forget", "forget a fact by key (in every category, or in one)")
    forget.add_argument("key")
    forget.add_argument("--category", help="only in this category")

    summary = command("summary", "show your summary, or replace it with --set")
    summary.add_argument("--set", metavar="TEXT", help="the new summary ('-' reads stdin)")

    extraction = command("extraction", "your sessions' extraction state: which are due")
    extraction.add_argument("--due", action="store_true", help="only the due sessions")
    extraction.add_argument("--limit", type=int, help="sessions per page (default 100)")
    extraction.add_argument("--after", help="the page after this session (next page)")
    extraction.add_argument(
        "--all-users", action="store_true", help="every user's sessions (memory.read_all only)"
    )

    delete_all = command("delete-all", "delete everything memory holds about you")
    delete_all.add_argument("--yes", action="store_true", help="yes, delete it")

    changes = command("changes", "the changes to your memory after a point (the change log)")
    changes.add_argument("--after-seq", type=int, help="after this change (default: all kept)")
    changes.add_argument("--limit", type=int, help="at most this many (default 500)")

    watch = command("watch", "print the changes to your memory as they happen (Ctrl-C stops)")
    watch.add_argument("--after-seq", type=int, help="first the changes after this one")
    watch.add_argument("--count", type=int, help="stop after this many changes")


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen subcommand."""
    parser = argparse.ArgumentParser(prog="turnstile", description="An actor runtime for agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a node: store, session actors and the gateway")
    serve.add_argument("--config", help="a TOML config file (see docs/operations.md)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8765)")
    serve.add_argument(
        "--store", help="sqlite:///path or postgresql://… (default sqlite:///turnstile.db)"
    )
    serve.add_argument(
        "--agent",
        choices=["demo", "scripted", "openai"],
        help="default demo (no model: a few requests, README); scripted echoes",
    )
    serve.add_argument("--dev-token", help="token of a single 'dev' user (or TURNSTILE_DEV_TOKEN)")
    serve.add_argument("--token-delay", type=float, help="demo, scripted: seconds per word")
    serve.set_defaults(func=_serve)

    attach = sub.add_parser("attach", help="attach a terminal to a session")
    attach.add_argument("session", nargs="?", help="session id (a new session if omitted)")
    attach.add_argument("--url", default=DEFAULT_URL, help=f"node URL (default {DEFAULT_URL})")
    attach.add_argument("--token", help="bearer token (or TURNSTILE_TOKEN)")
    attach.add_argument("--after-seq", type=int, help="replay events after this seq first")
    attach.set_defaults(func=_attach)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", default=DEFAULT_URL, help=f"node URL (default {DEFAULT_URL})")
    client.add_argument("--token", help="bearer token (or TURNSTILE_TOKEN)")
    client.add_argument("--json", action="store_true", help="print the node's JSON answer")

    sessions = sub.add_parser("sessions", help="list your sessions", parents=[client])
    sessions.set_defaults(func=_client(_sessions))

    jobs = sub.add_parser(
        "jobs",
        help="your scheduled jobs: list, show one with its runs, pause, resume, cancel one",
        parents=[client],
    )
    jobs.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "show", "pause", "resume", "cancel"],
    )
    jobs.add_argument("id", nargs="?", metavar="JOB", help="the job (show, pause, resume, cancel)")
    jobs.add_argument("--session", help="list: only this session's jobs")
    jobs.add_argument(
        "--state",
        choices=["active", "paused", "completed", "failed", "cancelled"],
        help="list: only jobs in this state (failed: the last run failed)",
    )
    jobs.set_defaults(func=_client(_jobs))

    watchers = sub.add_parser(
        "watchers",
        help="your watchers: list, show one with its checks, pause, resume, stop",
        parents=[client],
    )
    watchers.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "show", "pause", "resume", "stop"],
    )
    watchers.add_argument("id", nargs="?", metavar="WATCHER", help="the watcher (all but list)")
    watchers.add_argument("--session", help="list: only this session's watchers")
    watchers.set_defaults(func=_client(_watchers))

    memory = sub.add_parser("memory", help="your long-term memory; backfill of embeddings")
    memory_sub = memory.add_subparsers(dest="memory_command", required=True)
    _add_memory_commands(memory_sub)
    backfill = memory_sub.add_parser("backfill", help="embed the facts that have no embedding")
    backfill.add_argument("--config", help="the node's TOML config file")
    backfill.add_argument("--store", help="the store URL (default: the config's)")
    backfill.add_argument("--batch-size", type=int, help="facts per embedding request")
    backfill.add_argument(
        "--all",
        action="store_true",
        help="embed every fact anew (after changing to a model of the same dimension)",
    )
    backfill.set_defaults(func=_memory_backfill)

    nodes = sub.add_parser("nodes", help="the nodes sharing the store, alive or dead")
    nodes.add_argument("--config", help="the node's TOML config file (its store)")
    nodes.add_argument("--store", help="the store URL (default: the config's)")
    nodes.add_argument("--json", action="store_true", help="print the store's answer as JSON")
    nodes.set_defaults(func=_nodes)

    bench = sub.add_parser("bench", help="run benchmark scenarios", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)

    # ``bench`` hands everything after it to the bench's own parser (``--quick`` included,
    # which REMAINDER alone would refuse as an option of ``turnstile``).
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if args.command != "bench":
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.rest = [*unknown, *args.rest]
    if args.command in ("jobs", "watchers"):
        chosen = jobs if args.command == "jobs" else watchers
        if args.action == "list" and args.id is not None:
            chosen.error(f"list takes no {args.command[:-1]} id (got {args.id!r})")
        if args.action != "list" and args.id is None:
            chosen.error(f"{args.action} needs the {args.command[:-1]}'s id")
        if args.action != "list" and (args.session or getattr(args, "state", None)):
            chosen.error("--session and --state are for list")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
