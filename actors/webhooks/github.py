"""GitHub's CI events, read into what a session is woken with (scheduling-heartbeats.md §4).

Only two events matter, and only when they complete with a failure: ``check_run`` (concluded
``failure`` or ``timed_out``) and ``workflow_run`` (the same, and ``cancelled`` when configured).
A success, a run still in progress, and every other event wake nobody.

A failing run becomes a :class:`CiFailure`: the turn input's text (``content``), its payload
(what the reference lists: name, conclusion, output title and summary, details and html URLs,
branch, commit SHA, PR number, owner, repo, plus ``source_ref``), and the source keys sessions
bind themselves to, most specific first: ``github:owner/repo#<PR>`` for each pull request the run
belongs to, then ``github:owner/repo:branch:<branch>``. Owner and repository are lower-cased in
keys (GitHub matches them without regard to case); a branch keeps its case.

Payloads are decoded into Structs that name only the fields used (GitHub's others are ignored),
so a payload missing one, or with one of the wrong type, is a ``DecodeError`` naming its path
(``$.check_run.id``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from turnstile.runtime.codec import MAX_JSON_DEPTH, Codec
from turnstile.runtime.errors import DecodeError, InvalidArgument

__all__ = [
    "EVENTS",
    "FAILING",
    "CiFailure",
    "SourceKey",
    "branch_key",
    "event_identity",
    "parse_event",
    "parse_source_key",
    "pr_key",
]

#: The most of a run's output summary carried into the turn (GitHub allows 65,535 characters).
MAX_SUMMARY_CHARS = 4000
MAX_TITLE_CHARS = 500

_OWNER = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})"
_REPO = r"[A-Za-z0-9._-]{1,100}"
_BRANCH = r"[A-Za-z0-9._/+@-]{1,255}"
_KEY = re.compile(
    rf"github:(?P<owner>{_OWNER})/(?P<repo>{_REPO})"
    rf"(?:#(?P<pr>[1-9][0-9]{{0,9}})|:branch:(?P<branch>{_BRANCH}))\Z"
)

#: Conclusions that wake a session (a workflow's ``cancelled`` too when configured).
FAILING = ("failure", "timed_out")


class _Owner(msgspec.Struct):
    login: str


class _Repository(msgspec.Struct):
    name: str
    owner: _Owner


class _PullRequest(msgspec.Struct):
    number: int


class _Output(msgspec.Struct):
    title: str | None = None
    summary: str | None = None


class _CheckSuite(msgspec.Struct):
    head_branch: str | None = None


class _CheckRun(msgspec.Struct):
    id: int
    name: str
    head_sha: str
    status: str | None = None
    conclusion: str | None = None
    details_url: str | None = None
    html_url: str | None = None
    output: _Output | None = None
    check_suite: _CheckSuite | None = None
    head_branch: str | None = None
    pull_requests: list[_PullRequest] = msgspec.field(default_factory=list)


class _WorkflowRun(msgspec.Struct):
    id: int
    name: str | None
    head_sha: str
    head_branch: str | None = None
    status: str | None = None
    conclusion: str | None = None
    html_url: str | None = None
    logs_url: str | None = None
    display_title: str | None = None
    run_attempt: int | None = None
    pull_requests: list[_PullRequest] = msgspec.field(default_factory=list)


class _CheckRunEvent(msgspec.Struct):
    action: str
    check_run: _CheckRun
    repository: _Repository


class _WorkflowRunEvent(msgspec.Struct):
    action: str
    workflow_run: _WorkflowRun
    repository: _Repository


_CODECS: dict[str, Codec[Any]] = {
    "check_run": Codec(_CheckRunEvent, max_depth=MAX_JSON_DEPTH),
    "workflow_run": Codec(_WorkflowRunEvent, max_depth=MAX_JSON_DEPTH),
}

#: The events this module reads; any other answers "ignored".
EVENTS = tuple(_CODECS)


class SourceKey(msgspec.Struct, frozen=True):
    """A parsed source key: a pull request (``pr``) or a branch (``branch``) of a repository."""

    owner: str
    repo: str
    pr: int | None = None
    branch: str | None = None

    def __str__(self) -> str:
        if self.pr is not None:
            return pr_key(self.owner, self.repo, self.pr)
        return branch_key(self.owner, self.repo, self.branch or "")


def pr_key(owner: str, repo: str, number: int) -> str:
    """``github:owner/repo#<number>`` (owner and repo lower-cased)."""
    return f"github:{owner.lower()}/{repo.lower()}#{number}"


def branch_key(owner: str, repo: str, branch: str) -> str:
    """``github:owner/repo:branch:<branch>`` (owner and repo lower-cased)."""
    return f"github:{owner.lower()}/{repo.lower()}:branch:{branch}"


def parse_source_key(text: str, field: str = "source") -> SourceKey:
    """Read a source key as a session binds itself to it, normalised.

    Raises:
        InvalidArgument: not ``github:owner/repo#<PR>`` or ``github:owner/repo:branch:<name>``.
    """
    match = _KEY.match(text)
    if match is None:
        raise InvalidArgument(
            "a source is github:owner/repo#<PR number> or github:owner/repo:branch:<branch>",
            field=field,
        )
    pr = match["pr"]
    return SourceKey(
        owner=match["owner"].lower(),
        repo=match["repo"].lower(),
        pr=None if pr is None else int(pr),
        branch=match["branch"],
    )


class CiFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A failing CI run, ready to be delivered.

    Attributes:
        event: ``check_run`` or ``workflow_run``.
        owner: the repository's owner as GitHub spells it.
        repo: the repository's name as GitHub spells it.
        source_ref: ``owner/repo#check_run:<id>`` (or ``#workflow_run:<id>``).
        identity: what the event is, whichever delivery carries it (:func:`event_identity`):
            the node records it once, so a delivery resent under a new ``X-GitHub-Delivery``
            runs no second turn.
        source_keys: the keys sessions bind to, most specific first.
        content: the turn's text.
        payload: the turn input's other keys.
    """

    event: str
    owner: str
    repo: str
    source_ref: str
    identity: str
    source_keys: list[str]
    content: str
    payload: dict[str, Any]


def event_identity(
    owner: str, repo: str, event: str, run_id: int, attempt: int, conclusion: str
) -> str:
    """``github:<owner>/<repo>#<event>:<run id>:<attempt>:<conclusion>``, owner and repository
    lower-cased: one failure of one attempt of one run, however often it is delivered.

    A ``workflow_run`` carries its ``run_attempt`` (a re-run is the same id, the next attempt); a
    ``check_run`` has no attempt (GitHub gives a re-run job a new check run, so a new id) and
    counts as attempt 1.
    """
    return f"github:{owner.lower()}/{repo.lower()}#{event}:{run_id}:{attempt}:{conclusion}"


def _cut(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def parse_event(
    event: str, body: bytes, *, workflow_cancelled: bool = False
) -> CiFailure | Literal["ignored"]:
    """Read a ``check_run`` or ``workflow_run`` delivery's body.

    Returns:
        the failure to deliver, or ``"ignored"`` (not completed, or not a failing conclusion).

    Raises:
        KeyError: an event this module does not read (the caller answers "ignored" first).
        DecodeError: malformed JSON (``field`` ``body``) or a field missing or mistyped
            (``field`` its path).
    """
    try:
        parsed = _CODECS[event].decode_json(body)
    except DecodeError as exc:
        if exc.field is None:
            raise DecodeError(str(exc), field="body") from None
        raise
    owner, repo = parsed.repository.owner.login, parsed.repository.name
    if isinstance(parsed, _CheckRunEvent):
        run = parsed.check_run
        failing: tuple[str, ...] = FAILING
        branch = (run.check_suite.head_branch if run.check_suite else None) or run.head_branch
        output = run.output or _Output()
        name, details_url = run.name, run.details_url
        title, summary = output.title, output.summary
        attempt = 1
    else:
        run = parsed.workflow_run
        failing = (*FAILING, "cancelled") if workflow_cancelled else FAILING
        branch = run.head_branch
        name, details_url = run.name or "workflow", run.logs_url
        title, summary = run.display_title, None
        attempt = run.run_attempt or 1
    if parsed.action != "completed" or run.conclusion not in failing:
        return "ignored"
    prs = [pr.number for pr in run.pull_requests]
    keys = [pr_key(owner, repo, number) for number in prs]
    if branch:
        keys.append(branch_key(owner, repo, branch))
    source_ref = f"{owner}/{repo}#{event}:{run.id}"
    pr_number = prs[0] if prs else None
    payload = {
        "type": f"{event}_failed",
        "name": name,
        "conclusion": run.conclusion,
        "output_title": _cut(title, MAX_TITLE_CHARS),
        "output_summary": _cut(summary, MAX_SUMMARY_CHARS),
        "details_url": details_url,
        "html_url": run.html_url,
        "branch": branch,
        "commit_sha": run.head_sha,
        "pr_number": pr_number,
        "owner": owner,
        "repo": repo,
        "run_id": run.id,
    }
    return CiFailure(
        event=event,
        owner=owner,
        repo=repo,
        source_ref=source_ref,
        identity=event_identity(owner, repo, event, run.id, attempt, str(run.conclusion)),
        source_keys=keys,
        content=_content(event, payload),
        payload=payload,
    )


def _content(event: str, p: dict[str, Any]) -> str:
    """The turn's text: what failed, where, and where to look."""
    what = "check run" if event == "check_run" else "workflow run"
    where = [f"PR #{p['pr_number']}"] if p["pr_number"] is not None else []
    if p["branch"]:
        where.append(f"branch {p['branch']}")
    where.append(f"commit {p['commit_sha'][:12]}")
    lines = [
        f'[CI FAILED] {p["owner"]}/{p["repo"]}: {what} "{p["name"]}" concluded {p["conclusion"]}',
        " · ".join(where),
    ]
    if p["output_title"]:
        lines.append(f"Output: {p['output_title']}")
    if p["output_summary"]:
        lines.append(p["output_summary"])
    if p["details_url"]:
        lines.append(f"Details: {p['details_url']}")
    if p["html_url"]:
        lines.append(f"Run: {p['html_url']}")
    return "\n".join(lines)
