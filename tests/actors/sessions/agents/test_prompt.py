"""The runtime's default system prompt (``actors.sessions.agents.prompt``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from turnstile.actors.sessions.agents.prompt import build_system_prompt, session_timezone
from turnstile.runtime.errors import InvalidArgument

NOW = datetime(2026, 3, 13, 14, 35, tzinfo=UTC)


def test_the_primitives_section_says_results_arrive_by_themselves():
    prompt = build_system_prompt(tools={"run_parallel", "background_run"}, now=NOW)
    assert prompt.startswith("EXECUTION PRIMITIVES\n")
    assert "- run_parallel:" in prompt and "- background_run:" in prompt
    assert "arrive by themselves" in prompt and "Do not poll" in prompt
    assert prompt.endswith("TIME\nSession time zone: UTC. Current time: 2026-03-13 14:35 (Friday).")


@pytest.mark.parametrize(
    ("tools", "present", "absent"),
    [
        ({"run_parallel"}, [], ["- watch_start:", "- schedule_once", "tool_search"]),
        ({"watch_start"}, ["- watch_start:"], ["- schedule_once"]),
        ({"remember"}, ["- schedule_once, schedule_cron, remember:"], ["- watch_start:"]),
        ({"tool_search"}, ["tool_search's description indexes them"], ["- watch_start:"]),
        ({"send_notification"}, [], ["default channel"]),  # no default channel: no paragraph
    ],
)
def test_paragraphs_follow_the_tools_the_turn_carries(tools, present, absent):
    prompt = build_system_prompt(tools=tools, now=NOW)
    for text in present:
        assert text in prompt
    for text in absent:
        assert text not in prompt


def test_a_group_turned_off_is_not_mentioned():
    full = build_system_prompt(tools={"send_notification"}, now=NOW, default_channel="ops")
    assert "[WATCHER UPDATE]" in full and "[SCHEDULED …]" in full and "watch_status" in full
    assert "Jobs and watchers deliver there too" in full
    hidden = {"watch_start", "watch_status", "schedule_once", "remember"}
    prompt = build_system_prompt(
        tools={"send_notification"}, now=NOW, default_channel="ops", hidden=hidden
    )
    for word in ("watch", "WATCHER", "SCHEDULED", "schedule", "Jobs", "remember"):
        assert word not in prompt, word
    assert (
        "Background results arrive by themselves, as messages starting [BACKGROUND TASK "
        "COMPLETED] or [BACKGROUND TASK FAILED]. Do not poll for them with background_status "
        "or background_wait: carry on, and act on the message when it comes."
    ) in prompt
    watchers_only = build_system_prompt(
        tools={"send_notification"}, now=NOW, default_channel="ops", hidden={"schedule_once"}
    )
    assert "Watchers deliver there too unless you give another output_channel." in watchers_only
    assert "SCHEDULED" not in watchers_only and "[WATCHER UPDATE]" in watchers_only


def test_a_default_channel_is_named():
    prompt = build_system_prompt(tools={"send_notification"}, now=NOW, default_channel="ops")
    assert "The default channel is 'ops'" in prompt


def test_the_time_is_given_in_the_sessions_zone_and_in_utc():
    prompt = build_system_prompt(tools=(), now=NOW, timezone="Europe/Paris")
    assert prompt.endswith(
        "Session time zone: Europe/Paris. Current time: 2026-03-13 15:35 (Friday), "
        "UTC+01:00; 2026-03-13 14:35 UTC."
    )
    offset = build_system_prompt(tools=(), now=NOW, timezone="UTC-05:30")
    assert "Current time: 2026-03-13 09:05 (Friday), UTC-05:30; 2026-03-13 14:35 UTC." in offset


def test_an_unknown_zone_is_refused():
    with pytest.raises(InvalidArgument):
        build_system_prompt(tools=(), now=NOW, timezone="Mars/Base")


def test_the_sessions_zone_comes_from_its_metadata_else_the_default():
    assert session_timezone({"timezone": "Asia/Tokyo"}) == "Asia/Tokyo"
    assert session_timezone({"timezone": "nowhere"}, "Europe/Paris") == "Europe/Paris"
    assert session_timezone({}, "nowhere") == "UTC"
