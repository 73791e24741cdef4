"""The ``turnstile`` command: ``serve`` a node, ``bench`` the runtime."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import trio

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:
    from runtime.server import ServeSettings, serve

    settings = ServeSettings(host=args.host, port=args.port, store=args.store)

    async def run() -> None:
        # SIGINT and SIGTERM both mean "shut down gracefully": stop the gateway, then the
        # actors (their on_stop runs), then close the store.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(serve, settings)
                print(
                    f"turnstile serving on {', '.join(binds)} (store {settings.store})", flush=True
                )
                async for signum in signals:
                    print(f"turnstile stopping ({signal.Signals(signum).name})", file=sys.stderr)
                    nursery.cancel_scope.cancel()
                    break

    trio.run(run)
    print("turnstile stopped", file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from bench.harness import main as bench_main

    return bench_main(args.rest)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen subcommand."""
    parser = argparse.ArgumentParser(prog="turnstile", description="An actor runtime for agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a node: store, actors and the HTTP gateway")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="TCP port (default 8765)")
    serve.add_argument(
        "--store",
        default="sqlite:///turnstile.db",
        help="sqlite:///path or postgresql://… (default sqlite:///turnstile.db)",
    )
    serve.set_defaults(func=_serve)

    bench = sub.add_parser("bench", help="run benchmark scenarios", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
