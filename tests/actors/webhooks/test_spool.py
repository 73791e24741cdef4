"""The webhook spool on its own (``actors/webhooks/spool.py``): durable files, one node per
folder, a bound, and a replayer that removes what the store took, keeps what met another outage
and sets aside what can never be ingested. The outage itself, end to end on PostgreSQL, is
``tests/e2e/test_webhook_spool.py``."""

from __future__ import annotations

import logging

import pytest

from turnstile.actors.webhooks.routes import Receivers
from turnstile.actors.webhooks.settings import WebhooksConfig
from turnstile.actors.webhooks.spool import Replayer, Spool, Spooled, SpoolFull
from turnstile.runtime.errors import DecodeError, StoreUnavailable

ENTRY = Spooled("github", "d-1", "check_run", b'{"action": "completed", "x": "\\u0000"}')


def test_a_written_delivery_is_on_disk_under_its_final_name_and_reads_back(tmp_path):
    spool = Spool(tmp_path / "spool", max_files=10)
    path = spool.write(ENTRY)
    assert path.parent == tmp_path / "spool" and path.suffix == ".delivery"
    assert not list((tmp_path / "spool").glob(".tmp-*"))
    assert spool.read(path) == ENTRY
    assert spool.count() == 1
    # a new owner of the folder (the node's next start) finds it
    spool.close()
    again = Spool(tmp_path / "spool", max_files=10)
    assert again.open() and again.files() == [path] and again.count() == 1


def test_a_folder_that_does_not_exist_is_made_only_when_a_delivery_is_spooled(tmp_path):
    spool = Spool(tmp_path / "spool", max_files=10)
    assert not spool.open() and not (tmp_path / "spool").exists()
    assert spool.files() == []
    spool.write(ENTRY)
    assert spool.usable and (tmp_path / "spool" / "failed").is_dir()


def test_beyond_max_files_nothing_is_spooled(tmp_path):
    spool = Spool(tmp_path / "spool", max_files=2)
    spool.write(ENTRY)
    spool.write(ENTRY)
    with pytest.raises(SpoolFull):
        spool.write(ENTRY)
    assert len(spool.files()) == 2


def test_a_second_process_on_the_same_folder_spools_nothing(tmp_path, caplog):
    first = Spool(tmp_path / "spool", max_files=10)
    first.write(ENTRY)
    second = Spool(tmp_path / "spool", max_files=10)
    with caplog.at_level(logging.WARNING, "turnstile.webhooks"):
        assert not second.open()
        with pytest.raises(SpoolFull):
            second.write(ENTRY)
    assert "held by another process" in caplog.text
    assert second.files() == []  # it replays nothing of the first's
    first.close()
    assert second.open() and len(second.files()) == 1


def test_a_temporary_file_a_crash_left_is_dropped_at_the_next_start(tmp_path):
    spool = Spool(tmp_path / "spool", max_files=10)
    spool.write(ENTRY)
    (tmp_path / "spool" / ".tmp-cut-mid-write.delivery").write_bytes(b"{")
    spool.close()
    again = Spool(tmp_path / "spool", max_files=10)
    assert again.open()
    assert not list((tmp_path / "spool").glob(".tmp-*")) and again.count() == 1


async def test_the_replayer_removes_ingested_and_duplicate_files_keeps_them_on_an_outage_and_sets_bad_ones_aside(  # noqa: E501
    tmp_path,
):
    spool = Spool(tmp_path / "spool", max_files=10)
    good, dup, bad = (Spooled("github", d, "check_run", b"{}") for d in ("good", "dup", "bad"))
    for entry in (good, dup, bad):
        spool.write(entry)
    (tmp_path / "spool" / "99999999999999999999-corrupt.delivery").write_bytes(b"not json")
    spool._count += 1
    out = True
    seen: list[str] = []

    async def deliver(entry: Spooled) -> dict:
        seen.append(entry.delivery)
        if out:
            raise StoreUnavailable("the store is unavailable")
        if entry.delivery == "bad":
            raise DecodeError("the body must be a JSON object", "body")
        if entry.delivery == "dup":
            return {"duplicate": True}
        return {"accepted": True, "sessions": 1, "unrouted": False}

    replayer = Replayer(spool, deliver)
    assert await replayer.replay() == 4  # stops at the first outage; nothing is lost
    assert seen == ["good"] and len(spool.files()) == 4
    out = False
    assert await replayer.replay() == 0
    assert spool.files() == []
    failed = sorted(p.name for p in (tmp_path / "spool" / "failed").iterdir())
    assert len(failed) == 2 and "99999999999999999999-corrupt.delivery" in failed
    assert await replayer.replay() == 0 and seen.count("bad") == 1  # never tried again


class _Ingress:
    def __init__(self) -> None:
        self.counted: list[tuple[str, str]] = []

    def count_delivery(self, outcome: str, hook: str) -> None:
        self.counted.append((outcome, hook))


class _Unavailable(Receivers):
    async def deliver(self, entry: Spooled) -> dict:
        raise StoreUnavailable("the store is unavailable")


async def test_an_outage_is_202_spooled_and_503_once_the_spool_is_full(tmp_path):
    ingress = _Ingress()
    spool = Spool(tmp_path / "spool", max_files=1)
    nudged: list[bool] = []
    receivers = _Unavailable(
        WebhooksConfig(),
        ingress,
        {},
        spool,
        lambda: nudged.append(True),  # type: ignore[arg-type]
    )
    answer = await receivers.accept(ENTRY)
    assert answer.status_code == 202 and answer.body == b'{"accepted":true,"spooled":true}'
    assert ingress.counted == [("spooled", "github")] and nudged == [True]
    with pytest.raises(StoreUnavailable):  # answered 503, as without a spool
        await receivers.accept(ENTRY)
    assert len(spool.files()) == 1
    without = _Unavailable(WebhooksConfig(), ingress, {})  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        await without.accept(ENTRY)
