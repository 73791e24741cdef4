"""What a node keeps of a caller's W3C ``tracestate`` (``runtime/tracecontext.py``): the list as
W3C Trace Context writes it, at most 32 members and 512 characters (cut by whole members, long
ones first, then from the end), anything malformed dropped whole rather than refused."""

from __future__ import annotations

import pytest

from turnstile.runtime.tracecontext import (
    MAX_TRACESTATE_CHARS,
    MAX_TRACESTATE_MEMBERS,
    checked_tracestate,
)

MEMBERS_32 = ",".join(f"k{i}=v" for i in range(MAX_TRACESTATE_MEMBERS))
LONG = "big=" + "x" * 200  # a member over 128 characters: the first a cut drops
#: 40 members of 15 characters: 639 characters, more than 32 members
MANY = ",".join(f"k{i:02d}=vvvvvvvvvvv" for i in range(40))
#: 30 members of 20 characters (with commas: 629): within the count, over the length
WIDE = ",".join(f"k{i:02d}=" + "v" * 16 for i in range(30))


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (None, None),
        ("", None),
        ("congo=t61rcWkgMzE", "congo=t61rcWkgMzE"),
        ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        # optional white space around members and empty members, as W3C allows
        (" rojo=1 ,\t, congo=2\t", "rojo=1,congo=2"),
        ("tenant@vendor=x", "tenant@vendor=x"),
        ("k=a value with spaces", "k=a value with spaces"),
        (MEMBERS_32, MEMBERS_32),
        # malformed: dropped whole
        (",,", None),
        ("Upper=1", None),  # keys are lowercase
        ("k=", None),  # a value has one character at least
        ("k=v ", "k=v"),  # (trailing white space is the list's, not the value's)
        ("k=a=b", None),  # "=" is not a value's character
        ("k=1,k=2", None),  # a key given twice
        ("k=1,junk", None),  # one bad member spoils the list
        ("k=caf\u00e9", None),  # printable ASCII only
        (MEMBERS_32 + ",k32=v", None),  # more than 32 members
        (MANY, None),
        ("k=" + "v" * 9000, None),  # too long to read at all
    ],
)
def test_a_tracestate_is_kept_as_w3c_writes_it_or_dropped(value, kept):
    assert checked_tracestate(value) == kept


def test_a_long_tracestate_is_cut_by_whole_members_long_ones_first_then_from_the_end():
    kept = checked_tracestate(f"first=1,{LONG},{WIDE}")
    assert kept is not None and len(kept) <= MAX_TRACESTATE_CHARS
    members = kept.split(",")
    assert LONG not in members  # over 128 characters: dropped first
    assert members[0] == "first=1"  # then from the end: the first ones stay
    assert members == ["first=1", *WIDE.split(",")[: len(members) - 1]]
    assert len(",".join([kept, WIDE.split(",")[len(members) - 1]])) > MAX_TRACESTATE_CHARS
    # within the bound, a long member is kept
    assert checked_tracestate(f"first=1,{LONG}") == f"first=1,{LONG}"
