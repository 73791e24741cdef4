"""What ``Memory`` tells its subscribers: every write, once it ended however it ended; a
subscriber that fails does not keep the others from being told."""

from __future__ import annotations

from turnstile.actors.memory.notices import Notices, UserChanged


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
    assert told == [UserChanged(owner="ada", what="facts")]
    assert "memory: a subscriber failed" in caplog.text
    end()
    end()  # ending twice is harmless
    notices.tell(UserChanged(owner="ada", what="summary"))
    assert len(told) == 1
