"""History within a budget (``actors.sessions.agents.context``): one test per rule."""

from __future__ import annotations

import pytest

from turnstile.actors.sessions.agents.base import HistoryEntry
from turnstile.actors.sessions.agents.context import (
    entry_tokens,
    estimate_tokens,
    fit_history,
    fit_messages,
    message_tokens,
    truncate_tool_result,
)


def user(text: str) -> HistoryEntry:
    return HistoryEntry(role="user", content=text, source="user")


def answer(text: str) -> HistoryEntry:
    return HistoryEntry(role="assistant", content=text, status="completed")


def tool(content: str, call_id: str) -> HistoryEntry:
    return HistoryEntry(
        role="tool", content=content, tool="http.get", arguments={"url": "u"}, call_id=call_id
    )


def tokens(entries: list[HistoryEntry]) -> int:
    return sum(entry_tokens(e) for e in entries)


def test_the_estimate_is_four_characters_a_token_rounded_up():
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 400)] == [0, 1, 1, 2, 100]


def test_a_history_that_fits_is_handed_over_unchanged():
    history = [user("hi"), tool('{"a":1}', "c1"), answer("hello")]
    assert fit_history(history, tokens(history)) == history


def test_oldest_turns_are_dropped_first():
    history = [user("one"), answer("1" * 100), user("two"), answer("2" * 100), user("three")]
    budget = tokens(history[2:])
    assert fit_history(history, budget) == history[2:]
    assert fit_history(history, budget - 1) == history[4:]


def test_a_tool_result_goes_with_its_call_and_its_turn():
    """A tool entry is its call and its answer; dropping a turn drops all of them together,
    so no tool message is left without the assistant call it answers, nor the reverse."""
    history = [
        user("fetch"),
        tool("r" * 40, "c1"),
        tool("s" * 40, "c2"),
        answer("done"),
        user("again"),
        tool("t" * 40, "c3"),
        answer("done again"),
    ]
    fitted = fit_history(history, tokens(history) - 1, keep_tool_chars=1000)
    assert fitted == history[4:]
    assert [e.call_id for e in fitted if e.role == "tool"] == ["c3"]


def test_long_tool_results_are_cut_with_a_pointer_before_any_turn_goes():
    big = '{"body": "' + "x" * 5000 + '"}'
    history = [user("get it"), tool(big, "c1"), answer("got it"), user("thanks")]
    budget = tokens(history) - 100
    fitted = fit_history(history, budget, keep_tool_chars=200)
    assert [e.role for e in fitted] == ["user", "tool", "assistant", "user"]
    cut = fitted[1]
    assert cut.content == big[:200] + f"… [truncated; {len(big)} chars — see history]"
    assert (cut.tool, cut.arguments, cut.call_id) == ("http.get", {"url": "u"}, "c1")
    assert history[1].content == big  # the caller's list is not changed
    assert tokens(fitted) <= budget


def test_only_as_many_results_are_cut_as_needed_oldest_first():
    history = [user("a"), tool("x" * 4000, "c1"), user("b"), tool("y" * 4000, "c2")]
    budget = tokens(history) - 10
    fitted = fit_history(history, budget, keep_tool_chars=100)
    assert "truncated" in fitted[1].content
    assert fitted[3].content == "y" * 4000


def test_a_cut_off_start_is_dropped_first():
    """A transcript trimmed to its last N entries may start mid-turn (a tool entry, an
    answer); that partial turn goes before any whole one."""
    history = [tool("r", "c0"), answer("old"), user("new"), answer("reply")]
    assert fit_history(history, tokens(history) - 1) == history[2:]


def test_no_budget_leaves_no_history():
    history = [user("hi"), answer("hello")]
    assert fit_history(history, 0) == []
    assert fit_history([], 0) == []


def test_a_turn_too_big_even_when_cut_is_dropped_whole():
    history = [user("q" * 4000), tool("r" * 4000, "c1"), answer("a")]
    assert fit_history(history, 50, keep_tool_chars=10) == []


def test_truncation_leaves_short_results_alone():
    assert truncate_tool_result("short", keep=10) == "short"
    assert truncate_tool_result("0123456789abc", keep=10) == (
        "0123456789… [truncated; 13 chars — see history]"
    )


def test_keep_must_not_be_negative():
    with pytest.raises(ValueError, match=r"^keep_tool_chars must be >= 0$"):
        fit_history([], 10, keep_tool_chars=-1)


def test_a_result_cut_again_keeps_the_full_length_in_its_pointer():
    once = truncate_tool_result("r" * 5000, keep=2000)
    twice = truncate_tool_result(once, keep=1000)
    assert twice == "r" * 1000 + "… [truncated; 5000 chars — see history]"
    assert truncate_tool_result(twice, keep=1000) == twice  # cutting to the same size: no change


# ---- one model call as a whole (fit_messages) ------------------------------------------------


def msg(role: str, content: str, **extra) -> dict:
    return {"role": role, "content": content, **extra}


def call(call_id: str) -> dict:
    function = {"name": "page", "arguments": "{}"}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "function": function}],
    }


def call_tokens(messages: list[dict], fixed: int = 0) -> int:
    return fixed + sum(message_tokens(m) for m in messages)


def test_a_call_that_fits_is_sent_unchanged():
    messages = [msg("system", "be brief"), msg("user", "old"), msg("user", "new")]
    before = [dict(m) for m in messages]
    assert fit_messages(messages, 1000, history=(1, 2)) == 0
    assert messages == before


def test_this_turns_result_keeps_what_the_budget_leaves_after_the_schemas():
    messages = [msg("user", "q"), call("c1"), msg("tool", "p" * 40_000, tool_call_id="c1")]
    assert fit_messages(messages, 2000, history=(0, 0), fixed_tokens=500) == 0
    kept = messages[2]["content"].split("… [truncated")[0]
    assert kept == "p" * len(kept) and messages[2]["content"].endswith("40000 chars — see history]")
    assert call_tokens(messages, 500) <= 2000
    assert len(kept) > 1500 * 4 - 200  # nearly all of the 1,500 tokens left, not 1,000 chars


def test_earlier_turns_go_whole_oldest_first_before_this_turn_is_cut():
    messages = [
        msg("system", "s"),
        msg("user", "first"),
        call("c0"),
        msg("tool", "x" * 900, tool_call_id="c0"),
        msg("assistant", "first answer"),
        msg("user", "second"),
        msg("assistant", "second answer"),
        msg("user", "now"),
        call("c1"),
        msg("tool", "y" * 2000, tool_call_id="c1"),
    ]
    dropped = fit_messages(messages, 600, history=(1, 7))
    assert dropped == 4  # the first turn: its input, call, result and answer together
    assert [m["content"] for m in messages[:4]] == ["s", "second", "second answer", "now"]
    assert messages[-1]["content"] == "y" * 2000  # enough without cutting this turn's result
    assert call_tokens(messages) <= 600


def test_what_cannot_be_cut_is_left_for_the_server_to_refuse():
    messages = [msg("system", "s" * 8000), msg("user", "q")]
    assert fit_messages(messages, 1000, history=(1, 1)) == 0
    assert messages[0]["content"] == "s" * 8000
