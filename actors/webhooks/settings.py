"""The webhooks feature's config section: ``[webhooks]``, events other systems send a node.

Example::

    [webhooks]
    retention_days = 7            # delivery records (the idempotency window) kept this long
    max_body_bytes = 1048576      # a larger body is refused (413)
    rate_per_minute = 600         # authenticated deliveries per hook per minute (429 beyond)
    admins = ["ada"]              # may list every user's unrouted events
    spool_dir = ""                # deliveries met by a store outage wait here (see below)
    spool_max_files = 10000       # beyond, a delivery during an outage is answered 503

    [webhooks.github]
    secret = ""                   # empty: env TURNSTILE_GITHUB_WEBHOOK_SECRET; unset: no route
    workflow_cancelled = false    # a cancelled workflow run counts as a failure

    [webhooks.github.repos."acme/app"]
    user = "ada"                  # unbound events of this repo are ada's …
    session = "ci"                # … and go to her session "ci" (empty: recorded as unrouted)
    users = ["bob"]               # who else may bind a session to it ("*": every user)

    [webhooks.hooks.deploys]      # POST /webhooks/deploys, Standard Webhooks
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"   # or secret_env = "DEPLOYS_SECRET"
    user = "ada"                  # whose sessions it reaches
    session = "{payload.session}" # the session, from the payload (a template, see template.py)
    tolerance_seconds = 300       # webhook-timestamp this far from now at most (replays)

Secrets are read from the file or from the environment (prefer the environment: config files
get committed), and never appear in a log line, an error or a repr of these structs.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from typing import Annotated

import msgspec

from turnstile.actors.webhooks.template import RouteTemplate, TemplateError

__all__ = [
    "ANY_USER",
    "GITHUB_SECRET_ENV",
    "RESERVED_HOOK_NAMES",
    "GitHubConfig",
    "HookConfig",
    "RepoConfig",
    "WebhooksConfig",
    "decode_whsec",
]

MiB = 1024 * 1024

#: Where the GitHub secret is read from when the config file gives none.
GITHUB_SECRET_ENV = "TURNSTILE_GITHUB_WEBHOOK_SECRET"

#: In a repository's ``users``: every user may bind to it.
ANY_USER = "*"

#: Names a declared hook cannot take: the GitHub route and the routes beside the hooks.
RESERVED_HOOK_NAMES = frozenset({"github", "unrouted"})

_HOOK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_USER = Annotated[str, msgspec.Meta(max_length=64, pattern=r"^([A-Za-z0-9_.@+-]+)?\Z")]
#: A user who may bind to a repository, or ``*``: every user.
_BINDER = Annotated[str, msgspec.Meta(max_length=64, pattern=r"^([A-Za-z0-9_.@+-]+|\*)\Z")]
_SESSION = Annotated[str, msgspec.Meta(max_length=128, pattern=r"^([A-Za-z0-9_.:-]+)?\Z")]
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}\Z")


def decode_whsec(secret: str) -> bytes:
    """A Standard Webhooks secret's key: ``whsec_`` then base64.

    Raises:
        ValueError: not ``whsec_`` + base64 of at least 16 bytes (the message never quotes it).
    """
    if not secret.startswith("whsec_"):
        raise ValueError("a Standard Webhooks secret starts with whsec_")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a Standard Webhooks secret is whsec_ then base64") from None
    if len(key) < 16:
        raise ValueError("a Standard Webhooks secret must hold at least 16 bytes")
    return key


class RepoConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[webhooks.github.repos."owner/repo"]``.

    Who may bind a session to the repository's events (``bind_source``, ``POST
    /sessions/{id}/bindings``, a pull request opened through ``http.post``) is ``user`` and
    the users listed in ``users``, nobody else: the default lets the repository's own user
    alone, a wider list is written out, and ``"*"`` in it lets every user. A repository with
    neither (or with no section at all) lets nobody bind: its events are listed unrouted to
    admins. The same rule is applied again when an event is routed, so a binding made before
    it, or by a user since dropped from the list, wakes nothing.

    Attributes:
        user: the user the repository's unbound events belong to (its default session's owner;
            their unrouted events are listed to that user), who may always bind to it. Empty:
            admins only.
        session: ``user``'s session that gets the events no session bound itself to; empty, or
            a session that does not exist, records them as unrouted.
        users: who else may bind a session to this repository; ``"*"`` lets every user.
    """

    user: _USER = ""
    session: _SESSION = ""
    users: list[_BINDER] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.session and not self.user:
            raise ValueError("a default session needs its user")

    def binders(self) -> frozenset[str] | None:
        """The users who may bind to the repository; None when every user may (``"*"``)."""
        if ANY_USER in self.users:
            return None
        return frozenset([*self.users, *([self.user] if self.user else [])])


class GitHubConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[webhooks.github]``: ``POST /webhooks/github`` (mounted only with a secret).

    Attributes:
        secret: the webhook's secret (``X-Hub-Signature-256``); empty reads
            ``TURNSTILE_GITHUB_WEBHOOK_SECRET``.
        workflow_cancelled: a ``workflow_run`` concluded ``cancelled`` counts as failing (a
            ``check_run`` never does: ``failure`` and ``timed_out`` only).
        repos: per repository (``owner/repo``, matched without regard to case): its default
            session and who may bind to it.
    """

    secret: str = ""
    workflow_cancelled: bool = False
    repos: dict[str, RepoConfig] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.repos:
            if not _REPO.match(name):
                raise ValueError(f"repos: {name!r} is not owner/repo")
        self.repos = {name.lower(): repo for name, repo in self.repos.items()}

    def __repr__(self) -> str:
        return f"GitHubConfig(secret={'***' if self.secret else ''!r}, repos={sorted(self.repos)})"

    def resolved_secret(self) -> bytes | None:
        """The secret's bytes (the file's, else the environment's), None when neither."""
        secret = self.secret or os.environ.get(GITHUB_SECRET_ENV, "")
        return secret.encode("utf-8") if secret else None

    def repo(self, owner: str, repo: str) -> RepoConfig | None:
        """The repository's settings, if it has any."""
        return self.repos.get(f"{owner}/{repo}".lower())

    def binders(self, owner: str, repo: str) -> frozenset[str] | None:
        """Who may bind a session to ``owner/repo`` (:class:`RepoConfig`): a set of users (empty
        for a repository with no settings), or None when every user may."""
        settings = self.repo(owner, repo)
        return frozenset() if settings is None else settings.binders()


class HookConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[webhooks.hooks.<name>]``: ``POST /webhooks/<name>``, Standard Webhooks.

    Attributes:
        user: whose sessions the hook reaches (the template names a session of this user).
        secret: ``whsec_`` + base64; or empty and ``secret_env`` names the variable.
        secret_env: the environment variable holding the secret.
        session: the routing template: literal text and ``{payload.<key>…}`` placeholders.
        tolerance_seconds: a ``webhook-timestamp`` further than this from the node's clock is
            refused (a replay, or a clock far off).
        rate_per_minute: this hook's own rate (default: ``[webhooks] rate_per_minute``).
        max_body_bytes: this hook's own body limit (default: ``[webhooks] max_body_bytes``).
    """

    user: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@+-]+\Z")]
    secret: str = ""
    secret_env: str = ""
    session: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] = "{payload.session}"
    tolerance_seconds: Annotated[int, msgspec.Meta(ge=1, le=86_400)] = 300
    rate_per_minute: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1, le=25 * MiB)] | None = None

    def __post_init__(self) -> None:
        if self.secret and self.secret_env:
            raise ValueError("give secret or secret_env, not both")
        if self.secret:
            decode_whsec(self.secret)
        try:
            RouteTemplate.parse(self.session)
        except TemplateError as exc:
            raise ValueError(f"session: {exc}") from None

    def __repr__(self) -> str:
        return (
            f"HookConfig(user={self.user!r}, secret={'***' if self.secret else ''!r},"
            f" secret_env={self.secret_env!r}, session={self.session!r})"
        )

    def resolved_secret(self) -> bytes | None:
        """The key (``whsec_`` decoded), from the file or ``secret_env``; None when neither.

        Raises:
            ValueError: the environment's secret is not ``whsec_`` + base64.
        """
        secret = self.secret or (os.environ.get(self.secret_env, "") if self.secret_env else "")
        return decode_whsec(secret) if secret else None


class WebhooksConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[webhooks]``.

    Attributes:
        enabled: mount the routes and register the tools (the tables exist either way).
        retention_days: how long a delivery is remembered: a redelivery within it does
            nothing; records older are pruned (an unrouted event too).
        max_body_bytes: the largest body a hook takes (GitHub's check runs are a few KiB).
        rate_per_minute: authenticated deliveries a hook takes per minute, in bursts of as
            many; beyond, ``429`` with ``Retry-After``.
        max_bindings_per_session: sources one session may bind itself to.
        admins: users who may list every user's unrouted events.
        redeliver_seconds: how often deliveries not yet in their session's inbox (a full
            queue, a crash between the two steps) are tried again; also at start-up.
        spool_dir: where a signed delivery that meets an unavailable store is kept until the
            store is back (``spool.py``). Empty: beside a SQLite store's file
            (``<file>.webhook-spool``), else ``./turnstile-spool/<[node] id>``, or
            ``./turnstile-spool/<host name>-<port>`` without one. One node per folder (a
            lock): a second process on the same folder spools nothing.
        spool_max_files: the most deliveries spooled at once; beyond, a delivery during an
            outage is answered 503 (the sender retries, or it is lost as without a spool).
        github: ``[webhooks.github]``.
        hooks: ``[webhooks.hooks.<name>]``, the Standard Webhooks senders.
    """

    enabled: bool = True
    retention_days: Annotated[float, msgspec.Meta(gt=0, le=3650)] = 7.0
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1, le=25 * MiB)] = 1 * MiB
    rate_per_minute: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 600
    max_bindings_per_session: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100
    admins: list[str] = msgspec.field(default_factory=list)
    redeliver_seconds: Annotated[float, msgspec.Meta(ge=1, le=86_400)] = 60.0
    spool_dir: str = ""
    spool_max_files: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)] = 10_000
    github: GitHubConfig = msgspec.field(default_factory=GitHubConfig)
    hooks: dict[str, HookConfig] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.hooks:
            if not _HOOK_NAME.match(name):
                raise ValueError(f"hooks: {name!r} must be 1-64 of A-Z a-z 0-9 _ . -")
            if name in RESERVED_HOOK_NAMES:
                raise ValueError(f"hooks: {name!r} is reserved")
