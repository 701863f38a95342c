"""`oip.declared_elements` never counts more than the full parse (issue 27, item 7): a body it
refuses is one `parse_request` refuses too. Examples per property: `tests.fuzz.settings`."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve.wire import oip
from tests.fuzz.settings import examples

FUZZ = settings(max_examples=examples(100), deadline=None, suppress_health_check=list(HealthCheck))
KEYS = st.sampled_from(["inputs", "shape", "name", "data", "parameters", "outputs"]) | st.text()
TRICKY = st.sampled_from(['"shape": [7]', "{", "[", "]", "}", '\\"', "\\", '"inputs": [{'])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | TRICKY
)
SHAPES = st.lists(st.integers(0, 2000), max_size=3)
VALUES = st.recursive(
    SCALARS | SHAPES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
ENTRIES = st.dictionaries(KEYS, VALUES, max_size=4).flatmap(
    lambda extra: st.fixed_dictionaries({"shape": SHAPES | VALUES}).map(lambda d: {**extra, **d})
)
DOCS = st.dictionaries(KEYS, VALUES, max_size=3).flatmap(
    lambda extra: st.fixed_dictionaries({"inputs": st.lists(ENTRIES | VALUES, max_size=4)}).map(
        lambda d: {**extra, **d}
    )
)


def parsed_count(doc: Any) -> int:
    """The elements `oip._check_elements` counts after a full parse."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        return 0
    total = 0
    for entry in doc["inputs"]:
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape):
            total += math.prod(shape)
    return total


@FUZZ
@given(DOCS, st.booleans())
def test_the_prescan_never_counts_more_than_the_parse(doc: dict, compact: bool) -> None:
    body = json.dumps(doc, separators=(",", ":") if compact else None).encode()
    counted = oip.declared_elements(body)
    assert counted <= parsed_count(json.loads(body))
    if b"\\" not in body and len(body) <= oip.PRESCAN_BYTES:
        assert counted == parsed_count(json.loads(body))  # and all of it where it is certain
