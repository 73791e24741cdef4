"""The demo agent's answers to what comes back by itself (a recall, a scheduled notification,
a watcher's escalation, a background task's end), in the words the features send them: as the
turn's input, as one of its system messages, or folded into a turn."""

from __future__ import annotations

from dataclasses import dataclass, field

from turnstile.actors.demo import DemoAgent
from turnstile.actors.sessions.agents import HistoryEntry, ToolResult, TurnInput

WATCH = (
    '[WATCHER UPDATE] watcher_id=a1b2c3d4e5f6, label="https://example.com/", tool=http.get\n'
    "Check #{n} (interval: 30s, 2 notification(s) so far, strategy: on_change)\n"
    'Result: {{"status_code": 200, "headers": {{}}, "body": "version 2", "encoding": "text",'
    ' "bytes": 9, "elapsed_ms": 3}}'
)
DONE = (
    "[BACKGROUND TASK COMPLETED] task_id=bg-a1b2c3d4, tool=http.get, elapsed=1.2s\n"
    'Result: {"success": true, "data": {"status_code": 200, "bytes": 1256}}'
)
FAILED = (
    "[BACKGROUND TASK FAILED] task_id=bg-a1b2c3d4, tool=http.get, elapsed=31.0s\n"
    "Error: lost: node 'a' stopped before the task finished"
)


@dataclass
class Turn:
    input: TurnInput
    injections: list[HistoryEntry] = field(default_factory=list)
    session_id: str = "s"
    history: list = field(default_factory=list)
    tools: list = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)

    async def emit(self, type, text) -> None:
        self.streamed.append(text)

    async def call_tool(self, name, arguments, call_id=None) -> ToolResult:
        raise AssertionError(f"no tool call expected, got {name}")

    def take_injections(self) -> list[HistoryEntry]:
        taken, self.injections = self.injections, []
        return taken

    def add_usage(self, usage) -> None:
        pass


async def answer(source: str, content: str, **fields) -> str:
    turn = Turn(TurnInput(input_id=1, source=source, content=content, **fields))
    reply = await DemoAgent().run_turn(turn)
    assert "".join(turn.streamed) == reply
    return reply


async def test_its_own_reminder_and_another_recall():
    trigger = "[RECALL] recall_id=rc_1 call_type=once note=stretch"
    reminder = {"instruction": "Remind the user: stretch", "is_recall": True}
    assert await answer("recall", trigger, payload=reminder) == "⏰ Reminder: stretch"
    rappel = {"instruction": "Rappeler à l'utilisateur : m'étirer"}
    assert await answer("recall", trigger, payload=rappel) == "⏰ Rappel : m'étirer"
    other = {"instruction": "Read /tmp/build.log and report."}
    assert (
        await answer("recall", trigger, payload=other)
        == "⏰ Recall: Read /tmp/build.log and report."
    )


async def test_scheduled_notifications_and_cron_prompts():
    note = "[SCHEDULED NOTIFICATION] job_id=3f2a9c0d1b7e label=standup\nstandup"
    assert await answer("cron", note) == "🔔 standup"
    assert await answer("cron", "daily report") == "🔔 daily report"  # an llm_prompt job


async def test_a_watchers_first_look_then_a_change():
    first = await answer("notification", WATCH.format(n=1))
    assert first == (
        "👀 https://example.com/: first look taken (HTTP 200, 9 bytes); I will say when it changes."
    )
    changed = await answer("notification", WATCH.format(n=4))
    assert changed == "👀 https://example.com/ changed (check #4): HTTP 200, 9 bytes"


async def test_background_tasks_done_and_failed_and_two_in_one_input():
    assert await answer("notification", DONE) == (
        "📦 Task bg-a1b2c3d4 (http.get) done in 1.2s: HTTP 200, 1256 bytes"
    )
    both = await answer("notification", DONE + "\n\n" + FAILED)
    assert both.splitlines() == [
        "📦 Task bg-a1b2c3d4 (http.get) done in 1.2s: HTTP 200, 1256 bytes",
        "📦 Task bg-a1b2c3d4 (http.get) failed: lost: node 'a' stopped before the task finished",
    ]


async def test_a_refused_address_says_how_to_allow_it():
    refused = (
        "[BACKGROUND TASK FAILED] task_id=bg-1, tool=http.get, elapsed=0.0s\n"
        "Error: refusing 127.0.0.1 (loopback address) for host 'localhost'"
    )
    assert await answer("notification", refused) == (
        "📦 Task bg-1 (http.get) failed: refusing 127.0.0.1 (loopback address) for host"
        " 'localhost' (loopback and private addresses are refused unless [modules.http]"
        " allowed_hosts or allowed_networks allows them, docs/tools.md)"
    )


async def test_a_notice_as_a_system_message_is_answered_too():
    reply = await answer("notification", "(background work finished)", system_messages=(DONE,))
    assert reply == "📦 Task bg-a1b2c3d4 (http.get) done in 1.2s: HTTP 200, 1256 bytes"


async def test_a_notice_folded_into_a_users_turn():
    turn = Turn(TurnInput(input_id=1, source="user", content="hello"))
    turn.injections.append(HistoryEntry(role="user", content=DONE, source="notification"))
    reply = await DemoAgent().run_turn(turn)
    assert reply.startswith("You said: hello\n")
    assert reply.endswith("\n📦 Task bg-a1b2c3d4 (http.get) done in 1.2s: HTTP 200, 1256 bytes")


class Tools(Turn):
    """A turn whose tools answer what the test gives, recording the calls."""

    def __init__(self, content: str, answers: dict[str, ToolResult]) -> None:
        super().__init__(TurnInput(input_id=1, source="user", content=content))
        self.answers, self.calls = answers, []

    async def call_tool(self, name, arguments, call_id=None) -> ToolResult:
        self.calls.append((name, arguments))
        return self.answers[name]


async def test_whats_scheduled_lists_the_pending_recall_the_jobs_and_the_watchers():
    turn = Tools(
        "what's scheduled?",
        {
            "schedule_list": ToolResult(
                ok=True,
                data={
                    "jobs": [
                        {"job_id": "rc_1", "label": "stretch"},  # the recall, listed below
                        {"job_id": "j1", "label": "standup", "understood": "every weekday"},
                    ]
                },
            ),
            "manage_recall": ToolResult(
                ok=True,
                data={
                    "pending_recall_id": "rc_1",
                    "recalls": [
                        {"recall_id": "rc_0", "internal_comment": "old"},  # fired
                        {
                            "recall_id": "rc_1",
                            "internal_comment": "stretch",
                            "trigger_at": "2026-11-27T23:12:16.316220Z",
                        },
                    ],
                },
            ),
            "watch_list": ToolResult(
                ok=True,
                data={
                    "watchers": [
                        {
                            "watcher_id": "w1",
                            "label": "https://x/",
                            "interval": 30,
                            "status": "paused",
                        }
                    ]
                },
            ),
        },
    )
    reply = await DemoAgent().run_turn(turn)
    assert [name for name, _ in turn.calls] == ["schedule_list", "manage_recall", "watch_list"]
    assert reply.splitlines() == [
        "Scheduled:",
        "- ⏰ rc_1: “stretch” — 2026-11-27T23:12:16Z",
        "- 📅 j1: “standup” — every weekday",
        "- 👀 w1: https://x/ every 30 s (paused)",
        "“cancel <id>” drops one.",
    ]


async def test_cancel_finds_what_the_id_names():
    gone = ToolResult(ok=False, error={"code": "not_found", "message": "no job with id 'w1'"})
    turn = Tools("cancel w1", {"schedule_cancel": gone, "watch_stop": ToolResult(ok=True)})
    assert await DemoAgent().run_turn(turn) == "Cancelled w1."
    assert turn.calls == [
        ("schedule_cancel", {"job_id": "w1"}),
        ("watch_stop", {"watcher_id": "w1"}),
    ]
    pending = ToolResult(ok=True, data={"pending_recall_id": "rc_2", "recalls": []})
    turn = Tools("annule rc_1", {"manage_recall": pending})
    assert await DemoAgent().run_turn(turn) == (
        "Rien ici ne porte l'id rc_1 (« qu'est-ce qui est prévu » les liste)."
    )
    assert turn.calls == [("manage_recall", {"action": "list"})]  # not the other recall
