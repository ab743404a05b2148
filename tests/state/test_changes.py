"""The change counter the processes of `turnout serve --workers N` share (turnout.state.changes)."""

from __future__ import annotations

from pathlib import Path

from turnout.state.changes import ChangeCounter


def test_a_bump_is_seen_by_the_other_process_once(tmp_path: Path) -> None:
    mine, theirs = ChangeCounter(tmp_path), ChangeCounter(tmp_path)
    try:
        assert not mine.moved() and not theirs.moved()
        mine.bump()
        assert not mine.moved()  # its own change: nothing to re-read
        assert theirs.moved()
        theirs.caught_up(theirs.value())
        assert not theirs.moved()
        theirs.bump()
        theirs.bump()
        assert mine.moved() and mine.value() == 3
    finally:
        mine.close()
        theirs.close()


def test_a_new_process_starts_up_to_date(tmp_path: Path) -> None:
    first = ChangeCounter(tmp_path)
    first.bump()
    later = ChangeCounter(tmp_path)
    try:
        assert not later.moved() and later.value() == 1
    finally:
        first.close()
        later.close()
