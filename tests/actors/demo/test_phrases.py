"""What the demo agent reads, table-driven: each request in English and French, the time as
the scheduling parser delimits it, and what it leaves to the echo."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.actors.demo.phrases import (
    MAX_REQUEST_CHARS,
    Kind,
    Request,
    interval_seconds,
    read_request,
)

R = Request

CASES = [
    # reminders: the time first or last, as written
    ("remind me in 2 minutes to stretch", R(kind="remind", when="in 2 minutes", what="stretch")),
    ("Remind me to stretch in 2 minutes.", R(kind="remind", when="in 2 minutes", what="stretch")),
    (
        "remind me to call 5 people tomorrow at 9am",
        R(kind="remind", when="tomorrow at 9am", what="call 5 people"),
    ),
    (
        "rappelle-moi dans 2 minutes de m'étirer",
        R(kind="remind", lang="fr", when="dans 2 minutes", what="m'étirer"),
    ),
    (
        "Rappelle-moi demain à 9h d'appeler maman",
        R(kind="remind", lang="fr", when="demain à 9h", what="appeler maman"),
    ),
    (
        "rappelle-moi de m’étirer dans 2 minutes",
        R(kind="remind", lang="fr", when="dans 2 minutes", what="m’étirer"),
    ),
    # whatever the scheduling parser reads (halves and quarters: issue 24)
    (
        "remind me in half an hour to stretch",
        R(kind="remind", when="in half an hour", what="stretch"),
    ),
    (
        "rappelle-moi dans une demi-heure de boire",
        R(kind="remind", lang="fr", when="dans une demi-heure", what="boire"),
    ),
    (
        "remind me every weekday at 9am to stand up",
        R(kind="remind", when="every weekday at 9am", what="stand up", repeats=True),
    ),
    # schedules: repeating or not, decided by the parser
    (
        "every weekday at 9am say standup",
        R(kind="schedule", when="every weekday at 9am", what="standup", repeats=True),
    ),
    (
        "tous les jours de semaine à 9h dis standup",
        R(
            kind="schedule",
            lang="fr",
            when="tous les jours de semaine à 9h",
            what="standup",
            repeats=True,
        ),
    ),
    (
        "say standup every Monday at 10am",
        R(kind="schedule", when="every Monday at 10am", what="standup", repeats=True),
    ),
    ("tomorrow at 9am say hello", R(kind="schedule", when="tomorrow at 9am", what="hello")),
    # understood as a time, refused by the tool (which says why)
    ("every 7 minutes say hi", R(kind="schedule", when="every 7 minutes", what="hi", repeats=True)),
    (
        "watch https://example.com every 30 seconds and tell me when it changes",
        R(kind="watch", url="https://example.com", every="30 seconds"),
    ),
    ("watch https://example.com", R(kind="watch", url="https://example.com")),
    (
        "surveille https://example.com toutes les 30 secondes et préviens-moi quand ça change",
        R(kind="watch", lang="fr", url="https://example.com", every="30 secondes"),
    ),
    ("fetch https://example.com in the background", R(kind="fetch", url="https://example.com")),
    (
        "récupère https://example.com en arrière-plan",
        R(kind="fetch", lang="fr", url="https://example.com"),
    ),
    ("remember that I like dark roast", R(kind="remember", what="I like dark roast")),
    (
        "souviens-toi que j'aime le café noir",
        R(kind="remember", lang="fr", what="j'aime le café noir"),
    ),
    ("What do you remember about me?", R(kind="recall_memory")),
    ("Que sais-tu de moi ?", R(kind="recall_memory", lang="fr")),
    ("what's scheduled?", R(kind="list")),
    ("Qu'est-ce qui est prévu ?", R(kind="list", lang="fr")),
    ("cancel rc_4f2a9c0d1b7e", R(kind="cancel", target="rc_4f2a9c0d1b7e")),
    ("annule bg-a1b2c3d4", R(kind="cancel", lang="fr", target="bg-a1b2c3d4")),
    ("help", R(kind="help")),
    ("aide", R(kind="help", lang="fr")),
    # not requests: left to the echo
    ("hello there", None),
    ("stop it", None),
    ("remind me tomorrow", None),
    ("remind me in 7 parsecs to stretch", None),
    ("I say hello", None),
    ("job 3", None),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_read_request(text, expected):
    assert read_request(text) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30 seconds", 30),
        ("30 secondes", 30),
        ("minute", 60),
        ("2 minutes", 120),
        ("1h", 3600),
        ("half a minute", 30),
        ("quarter of an hour", 900),
    ],
)
def test_an_interval_is_read_as_the_parser_reads_a_delay(text, seconds):
    assert interval_seconds(text) == seconds


def test_long_text_is_no_request():
    when = " in 2 minutes"
    filler = "x" * (MAX_REQUEST_CHARS - len("remind me to ") - len(when))
    assert read_request(f"remind me to {filler}{when}") == R(
        kind="remind", when="in 2 minutes", what=filler
    )
    assert read_request(f"remind me to {filler}y{when}") is None


def test_what_is_no_interval():
    assert interval_seconds("fortnightly-ish") is None


WORDS = st.sampled_from(
    "remind me to that in 2 minutes every weekday at 9am say watch fetch https://x the "
    "background remember rappelle-moi de d' qu' dans tous les jours à 9h dis cancel rc_1 30 "
    "seconds secondes tomorrow demain é ’ ? . , * @daily 0 2026-11-22T09:00 and tell".split()
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(WORDS, max_size=25).map(" ".join), st.text(max_size=600)))
def test_any_text_is_read_or_left_without_an_error(text):
    found = read_request(text)
    assert found is None or found.kind in get_args(Kind)
