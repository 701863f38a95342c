"""Property tests (hypothesis) for what parses untrusted or corruptible bytes.

The frame codec (serve/wire/frames.py), the Open Inference Protocol and KServe v1 request codecs and
the archive reader: any input either parses or raises the module's own error (``ProtocolError``,
``BadRequest``, ``ArchiveError``) that the server answers as 4xx, never anything else; and what
is encoded decodes to the same thing. Examples per property: `tests.fuzz.settings`.
"""

from __future__ import annotations

import io
import json
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archiver import ArchiveError, open_archive, read_manifest
from serve.wire import kserve_v1, oip
from serve.wire.errors import BadRequest, ServeError
from serve.wire.frames import Frame, FrameDecoder, MsgType, ProtocolError, encode_bytes
from tests.fuzz.settings import examples

FUZZ = settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)

# ----- frames -----------------------------------------------------------------------------------

frames = st.builds(
    Frame,
    st.sampled_from(list(MsgType)),
    st.integers(0, 2**32 - 1),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.lists(st.binary(max_size=64), max_size=4).map(tuple),
)


@FUZZ
@given(frame=frames, cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_frames_survive_any_chunking(frame: Frame, cuts: list[int]) -> None:
    data = encode_bytes(frame)
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    decoder = FrameDecoder()
    out = [f for chunk in chunks for f in decoder.feed(chunk)]
    assert out == [frame]


headers = st.builds(
    struct.Struct("!BIII").pack,
    st.integers(0, 255),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1) | st.integers(0, 64),
    st.integers(0, 2**32 - 1) | st.integers(0, 4),
)


@FUZZ
@given(head=headers | st.just(b""), data=st.binary(max_size=256))
def test_corrupt_frames_are_a_protocol_error_or_wait_within_the_limit(
    head: bytes, data: bytes
) -> None:
    limit = 1 << 16
    decoder = FrameDecoder(max_frame_size=limit)
    try:
        decoded = decoder.feed(head + data)
    except ProtocolError:
        return
    assert all(isinstance(frame.meta, dict) for frame in decoded)
    # No error: it may only be waiting for the rest of a frame that fits the limit.
    pending = head + data
    if len(pending) >= 13 and not decoded:
        _, _, meta_len, count = struct.Struct("!BIII").unpack_from(pending)
        assert 13 + 8 * count + meta_len <= limit


def test_a_frame_claiming_more_than_the_limit_fails_at_once() -> None:
    # 2**32 - 1 payload lengths: no need to wait for 32 GiB of table to know it is too big.
    head = struct.Struct("!BIII").pack(1, 0, 2, 2**32 - 1)
    try:
        FrameDecoder(max_frame_size=1 << 20).feed(head)
    except ProtocolError:
        return
    raise AssertionError("the decoder waited for a frame it can never accept")


def test_frame_meta_must_be_a_json_object() -> None:
    for meta in (b"[1]", b"[" * 100_000):
        data = struct.Struct("!BIII").pack(1, 0, len(meta), 0) + meta
        try:
            FrameDecoder().feed(data)
        except ProtocolError:
            continue
        raise AssertionError(f"accepted meta {meta[:10]!r}")


# ----- Open Inference Protocol ------------------------------------------------------------------

tensors = st.fixed_dictionaries(
    {"name": st.text(max_size=4)},
    optional={
        "datatype": st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "BF16", "UINT8", "X"]),
        "shape": st.lists(st.integers(-2, 4), max_size=3) | json_values,
        "data": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "x"]), st.integers(-1, 16) | json_values
        ),
    },
)
oip_docs = st.fixed_dictionaries(
    {},
    optional={
        "inputs": st.lists(tensors, max_size=3) | json_values,
        "outputs": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=3)}, optional={"parameters": json_values}
            )
        )
        | json_values,
        "parameters": json_values,
        "id": json_values,
    },
)


@FUZZ
@given(doc=oip_docs, tail=st.binary(max_size=32), header=st.none() | st.integers(-2, 400))
def test_oip_requests_parse_or_are_a_400(doc: dict[str, Any], tail: bytes, header: Any) -> None:
    head = json.dumps(doc).encode()
    body = head + tail
    try:
        length = oip.header_length(None if header is None else str(header), len(body))
        request = oip.parse_request(body, length, max_elements=8)
    except ServeError as exc:  # 400, or 413 for too many elements
        assert exc.status_code in (400, 413), exc
        return
    for tensor in request.inputs:
        assert tensor.array().shape == tensor.shape  # what was accepted is a consistent tensor


@FUZZ
@given(data=st.binary(max_size=128))
def test_oip_random_bytes_are_a_400(data: bytes) -> None:
    try:
        oip.parse_request(data, None)
    except BadRequest:
        pass


# ----- KServe v1 --------------------------------------------------------------------------------

v1_docs = st.fixed_dictionaries(
    {},
    optional={
        "instances": st.lists(json_values | st.just({"b64": "aGk="}), max_size=4) | json_values,
        "inputs": json_values | st.fixed_dictionaries({"b64": st.text(max_size=6)}),
    },
)


@FUZZ
@given(doc=v1_docs | json_values)
def test_kserve_v1_requests_parse_or_are_a_400(doc: Any) -> None:
    try:
        request = kserve_v1.parse_predict(json.dumps(doc).encode(), max_elements=12)
    except ServeError as exc:  # 400, or 413 for too many values
        assert exc.status_code in (400, 413), exc
        return
    assert request.rows and all(isinstance(row, dict) for row in request.rows)


# ----- archives ---------------------------------------------------------------------------------

MANIFEST = {"runtime": "python", "model": {"modelName": "m", "handler": "h.py"}}
entry_names = st.sampled_from(
    ["h.py", "a/b.txt", "../x", "/abs", "a\\b", "MAR-INF/MANIFEST.json", "./", "d/", "c:/x"]
) | st.text(min_size=1, max_size=10)


@FUZZ
@pytest.mark.filterwarnings("ignore:Duplicate name")
@given(
    entries=st.lists(st.tuples(entry_names, st.binary(max_size=64)), max_size=5),
    manifest=st.one_of(st.just(MANIFEST), json_values),
    cut=st.none() | st.integers(0, 400),
)
def test_any_zip_opens_or_is_an_archive_error(
    entries: list[tuple[str, bytes]], manifest: Any, cut: int | None
) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        for name, data in entries:
            try:
                zf.writestr(name, data)
            except (ValueError, UserWarning):
                pass
    data = buffer.getvalue() if cut is None else buffer.getvalue()[:cut]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "m.mar"
        source.write_bytes(data)
        dest = Path(tmp) / "out" / "dest"
        try:
            read_manifest(source)
        except ArchiveError:
            pass
        try:
            archive = open_archive(source, dest)
        except ArchiveError:
            assert not dest.exists() or not any(dest.iterdir())  # nothing left behind
            return
        for path in dest.rglob("*"):  # everything it wrote is inside dest
            assert path.resolve().is_relative_to(dest.resolve())
        assert archive.model_dir.is_relative_to(dest.resolve())
