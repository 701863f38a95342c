"""Hostile gRPC input (issue 27, item 8): undecodable messages, absurd names and sequence ids.

One real server with token auth (as by default) and the torch-free ``echo`` model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from serve.identifiers import MAX_NAME, MAX_SEQUENCE_ID
from tests.support.grpc_stubs import bearer, generate
from tests.support.server import LanternServer, echo_archive

PREDICTIONS = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"
NOT_PROTOBUF = b"\xff\xff\xff\xff"  # a field tag whose varint never ends


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("grpc-hostile")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "echo")
    with LanternServer(work, store, ["echo=echo.mar"], token_auth=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def ts(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return generate(tmp_path_factory.mktemp("stubs"))


@pytest.fixture(scope="module")
def md(server: LanternServer) -> tuple[tuple[str, str], ...]:
    return bearer(server.keys()["inference"]["key"])


@pytest.fixture(scope="module")
def channel(server: LanternServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_inference) as ch:
        yield ch


def test_an_undecodable_message_is_invalid_argument_logged_once(
    server: LanternServer, channel: grpc.Channel, md: Any
) -> None:
    raw: grpc.UnaryUnaryMultiCallable = channel.unary_unary(PREDICTIONS)  # bytes in and out
    with pytest.raises(grpc.RpcError) as no_token:
        raw(NOT_PROTOBUF, timeout=30)
    assert no_token.value.code() == grpc.StatusCode.PERMISSION_DENIED
    for _ in range(20):
        with pytest.raises(grpc.RpcError) as refused:
            raw(NOT_PROTOBUF, metadata=md, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            "The request is not a valid org.pytorch.serve.grpc.inference.PredictionsRequest "
            "message."
        )
    deadline = time.monotonic() + 10
    while "Malformed gRPC request" not in server.log_text("lantern.log"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    log = server.log_text("lantern.log")
    assert log.count("Malformed gRPC request") == 1  # 20 calls in well under the interval
    assert "Traceback" not in log and "DecodeError" in log


def test_names_are_cut_in_messages_and_absurd_ones_refused(
    ts: SimpleNamespace, channel: grpc.Channel, md: Any
) -> None:
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    pb = ts.inference_pb2
    with pytest.raises(grpc.RpcError) as missing:
        stub.Predictions(pb.PredictionsRequest(model_name="m" * MAX_NAME), metadata=md, timeout=30)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    details = missing.value.details() or ""
    assert details.endswith("…") and len(details) < 200
    huge = "m" * 3_000_000
    with pytest.raises(grpc.RpcError) as absurd:
        stub.Predictions(pb.PredictionsRequest(model_name=huge), metadata=md, timeout=30)
    assert absurd.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = absurd.value.details() or ""
    assert f"at most {MAX_NAME}" in details
    assert len(details) < 200


def test_an_absurd_sequence_id_is_refused_in_band_and_not_echoed(
    ts: SimpleNamespace, channel: grpc.Channel, md: Any
) -> None:
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    pb = ts.inference_pb2
    requests = [
        pb.PredictionsRequest(model_name="echo", sequence_id="s" * 1_000_000, input={"data": b"1"}),
        pb.PredictionsRequest(
            model_name="echo", sequence_id="s" * MAX_SEQUENCE_ID, input={"data": b"2"}
        ),
    ]
    [refused, served] = list(stub.StreamPredictions2(iter(requests), metadata=md, timeout=60))
    assert refused.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert f"at most {MAX_SEQUENCE_ID}" in refused.status.message
    assert refused.sequence_id == "" and len(refused.SerializeToString()) < 1000
    assert served.status.code == 0 and served.sequence_id == "s" * MAX_SEQUENCE_ID
