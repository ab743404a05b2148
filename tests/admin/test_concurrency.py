"""If-Match parsing and checking (the rule every admin write uses)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from turnout.admin.concurrency import PreconditionFailed, check_if_match, etag_of, if_match

TAG = etag_of({"a": 1, "b": [1, 2]})


def test_etag_is_quoted_and_independent_of_key_order() -> None:
    assert TAG.startswith('"') and TAG.endswith('"') and len(TAG) == 22
    assert etag_of({"b": [1, 2], "a": 1}) == TAG and etag_of({"a": 2, "b": [1, 2]}) != TAG


@pytest.mark.parametrize(
    ("header", "tags"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ('"x"', ['"x"']),
        ('W/"x"', ['"x"']),
        ('"x", "y"', ['"x"', '"y"']),
        ("x", ['"x"']),  # an unquoted tag, as curl users type it
        ("*", ["*"]),
    ],
)
def test_if_match_parsing(header: str | None, tags: list[str] | None) -> None:
    headers = CIMultiDict[str]() if header is None else CIMultiDict({"if-match": header})
    assert if_match(headers) == tags


@pytest.mark.parametrize(
    ("header", "current", "passes"),
    [
        (None, TAG, True),  # no If-Match: unconditional
        (None, None, True),
        (TAG, TAG, True),
        (f'"other", {TAG}', TAG, True),
        (f"W/{TAG}", TAG, True),
        ("*", TAG, True),
        ('"other"', TAG, False),
        ("*", None, False),  # the thing is gone
        (TAG, None, False),
    ],
)
def test_check_if_match(header: str | None, current: str | None, passes: bool) -> None:
    headers = CIMultiDict[str]() if header is None else CIMultiDict({"If-Match": header})
    if passes:
        check_if_match(headers, current, "thing")
        return
    with pytest.raises(PreconditionFailed) as caught:
        check_if_match(headers, current, 'endpoint "mac"')
    err = caught.value
    assert err.status == 412 and err.code == "stale_write" and 'endpoint "mac"' in err.message
    assert err.headers.get("ETag") == current  # the current tag to reload with (none when it is gone)
