"""What ``Memory`` tells its subscribers, and what it announces to the other nodes: the payload
is the notice itself (one type for the writer and the reader), a node skips its own, and what
cannot be said exactly is said as ``AllChanged`` (forget every copy), never dropped."""

from __future__ import annotations

import logging

from turnstile.actors.memory.notices import (
    MAX_PAYLOAD_BYTES,
    AllChanged,
    Notices,
    UserChanged,
    announcement,
    read_announcement,
)


def test_an_announcement_is_the_notice_and_reads_back_as_it():
    notice = UserChanged(owner="ada", what="deleted", origin="n1")
    assert announcement(notice) == '{"type":"user","owner":"ada","what":"deleted","origin":"n1"}'
    assert read_announcement(announcement(notice)) == notice


def test_a_name_too_long_to_announce_is_announced_as_everything():
    notice = UserChanged(owner="x" * MAX_PAYLOAD_BYTES, what="summary", origin="n1")
    payload = announcement(notice)
    assert len(payload.encode()) < 8000
    assert read_announcement(payload) == AllChanged(
        why="a user name too long to announce", origin="n1"
    )


def test_an_announcement_that_does_not_decode_forgets_everything(caplog):
    caplog.set_level(logging.WARNING, logger="turnstile.memory")
    for payload in ("not json", '{"type":"user","owner":"ada","what":"mood"}', "{}"):
        assert read_announcement(payload) == AllChanged(why="an announcement that does not decode")
    assert len(caplog.records) == 3


def test_a_node_is_told_the_others_announcements_and_not_its_own():
    here, elsewhere = Notices(), Notices()
    assert here.origin != elsewhere.origin
    told = []
    here.subscribe(told.append)
    with elsewhere.telling("ada", "summary") as theirs:
        pass
    with here.telling("ada", "deleted") as ours:
        pass
    assert told == [ours]  # a write here is told as it ends …
    here.heard(announcement(ours))  # … and not again when PostgreSQL hands it back
    here.heard(announcement(theirs))
    here.heard(None)
    assert told == [
        ours,
        theirs,
        AllChanged(why="listening anew: announcements may have been missed"),
    ]
    assert here.listening.is_set()


def test_a_failing_subscriber_is_logged_and_the_others_are_still_told(caplog):
    notices = Notices()
    told = []

    def broken(notice):
        raise RuntimeError("boom")

    notices.subscribe(broken)
    end = notices.subscribe(told.append)
    try:
        with notices.telling("ada", "facts"):
            raise KeyError("the write failed")
    except KeyError:
        pass
    assert told == [UserChanged(owner="ada", what="facts", origin=notices.origin)]
    assert "memory: a subscriber failed" in caplog.text
    end()
    end()  # ending twice is harmless
    notices.tell(AllChanged(why="test"))
    assert len(told) == 1
