"""`serve.wire.json_input.long_list`: a list over its bound found without parsing (issue 39)."""

from __future__ import annotations

import json

import pytest

from serve.wire.json_input import PRESCAN_TOKENS, check_lists, long_list

BOUNDS = {("stop",): 2, ("parameters", "ids"): 3}


@pytest.mark.parametrize(
    ("body", "found"),
    [
        ({"stop": ["a", "b"]}, None),
        ({"stop": ["a", "b", "c"]}, ("stop",)),
        ({"stop": "a,b,c,d"}, None),  # a string, not a list
        ({"stop": [[1, 2, 3], [4, 5]]}, None),  # two items, whatever they hold
        ({"prompt": '"stop": [1, 2, 3, 4]', "stop": []}, None),  # the key inside a string
        ({"prompt": 'a \\"stop\\": [1,2,3]'}, None),  # escaped quotes
        ({"other": {"stop": [1, 2, 3]}}, None),  # not at the bounded path
        ({"parameters": {"ids": [1, 2, 3]}}, None),
        ({"parameters": {"ids": [1, 2, 3, 4]}}, ("parameters", "ids")),
        ({"parameters": {"x": [{"ids": [1, 2, 3, 4]}]}}, None),
        ({"x": [1] * 10, "stop": [{"a": [1, 2, 3]}, 2, 3]}, ("stop",)),
    ],
)
def test_a_long_list_is_found_where_the_parsed_document_has_it(
    body: dict[str, object], found: tuple[str, ...] | None
) -> None:
    raw = json.dumps(body).encode()
    assert long_list(raw, BOUNDS) == found
    assert check_lists(body, BOUNDS) == found  # the same answer after a parse


def test_what_the_scan_cannot_be_sure_of_it_leaves_to_the_parse() -> None:
    assert long_list(b'{"prompt": "unterminated, "stop": [1,2,3]}', BOUNDS) is None
    assert long_list(b'{"stop\\u0020": [1, 2, 3]}', BOUNDS) is None  # an escaped key
    padding = b"[]," * PRESCAN_TOKENS
    assert long_list(b'{"x": [' + padding + b'0], "stop": [1, 2, 3]}', BOUNDS) is None
    assert long_list(b'{"stop": [' + b"1," * 5_000_000 + b"1]}", BOUNDS) == ("stop",)
    deep = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000  # quick: no path is followed that deep
    assert long_list(deep, BOUNDS) is None
