"""Sequence continuous batching end to end: a stand-in of TorchServe 0.12's
examples/stateful/sequence_continuous_batching handler (tests/e2e/torchserve_examples), archived
with our archiver, served by a real server with two workers, driven over real HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.server import LanternServer, build_archive

EXAMPLES = Path(__file__).resolve().parent / "torchserve_examples"
SEQ = "ts_request_sequence_id"
END = "ts_request_sequence_end"
CONFIG = {
    # TorchServe's example model-config.yaml, with a longer idle time, one request per sequence
    # per batch (batchSize 1: maxNumSequence is then 2), and a long stream of short steps so that
    # a cancel always arrives while it runs.
    "minWorkers": 2,
    "maxWorkers": 2,
    "batchSize": 1,
    "maxNumSequence": 2,
    "sequenceMaxIdleMSec": 60000,
    "maxSequenceJobQueueSize": 10,
    "sequenceBatching": True,
    "continuousBatching": True,
    "handler": {"stream_steps": 100_000, "step_delay_ms": 5},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    root = tmp_path_factory.mktemp("seq_continuous")
    store = root / "store"
    store.mkdir()
    build_archive(store, "stateful", EXAMPLES / "stateful_continuous_handler.py", config=CONFIG)
    srv = LanternServer(root, store, ["stateful=stateful.mar"])
    srv.start(timeout=300)
    yield srv
    srv.stop()


def predict(server: LanternServer, body: bytes, seq: str | None = None) -> httpx.Response:
    headers = {SEQ: seq} if seq else {}
    url = f"{server.inference}/predictions/stateful"
    return httpx.post(url, content=body, headers=headers, timeout=60)


def end(server: LanternServer, seq: str, total: int) -> None:
    """Close a sequence with 0, as TorchServe's example does; its answer says it ended."""
    response = predict(server, b"0", seq)
    assert response.status_code == 200, response.text
    assert (response.json(), response.headers[END]) == (total, seq)


def test_describe_shows_the_settings(server: LanternServer) -> None:
    described = server.describe("stateful")[0]
    assert described["continuousBatching"] is True and described["stateful"] is True
    assert described["maxNumSequence"] == 2  # max(2, batchSize 1 x maxWorkers 2)
    assert described["maxSequenceJobQueueSize"] == 10
    assert described["sequenceMaxIdleMSec"] == 60000
    assert len(described["workers"]) == 2


def test_two_sequences_stay_separate_and_keep_their_order(server: LanternServer) -> None:
    # TorchServe's test: two clients, each opening a sequence and sending 5 even numbers.
    def client(step: int) -> tuple[str, list[int]]:
        first = predict(server, str(step).encode())
        seq, answers = first.headers[SEQ], [first.json()]
        for i in range(2, 6):
            response = predict(server, str(step * i).encode(), seq)
            assert response.headers[SEQ] == seq
            answers.append(response.json())
        return seq, answers

    with ThreadPoolExecutor(2) as pool:
        (seq0, got0), (seq1, got1) = pool.map(client, [2, 4])
    assert got0 == [2, 6, 12, 20, 30]
    assert got1 == [4, 12, 24, 40, 60]
    end(server, seq0, 30)
    end(server, seq1, 60)


def test_pipelined_requests_of_a_sequence_keep_order_on_one_worker(server: LanternServer) -> None:
    seq = predict(server, b"2").headers[SEQ]
    with ThreadPoolExecutor(8) as pool:  # all at once, on the one sequence
        answers = list(pool.map(lambda _: predict(server, b"2", seq).json(), range(8)))
    # one worker, in arrival order: each running sum exactly once (two workers or a lost order
    # would repeat one or skip one)
    assert sorted(answers) == [2 * i for i in range(2, 10)]
    end(server, seq, 18)


def test_cancel_ends_a_streaming_request_and_frees_the_sequence(server: LanternServer) -> None:
    seq = predict(server, b"2").headers[SEQ]
    url = f"{server.inference}/predictions/stateful"
    with httpx.stream("POST", url, content=b"5", headers={SEQ: seq}, timeout=60) as streaming:
        assert streaming.status_code == 200
        assert streaming.headers["ts_stream_next"] == "true"  # answered in parts
        parts = streaming.iter_bytes()
        received = next(parts)  # its first part is out: the request now runs on its worker
        assert received.startswith(b"7")
        cancel = predict(server, b"-1", seq)  # joins the running one's batches
        assert (cancel.status_code, cancel.json()) == (200, -1)
        for part in parts:  # the stream ends at its next step, not after 100000 of them
            received += part
    assert set(received.decode()) == {"7"} and len(received) < 100_000
    # The sequence is free again: its state is kept, and a new request is answered at once.
    follow = predict(server, b"4", seq)
    assert (follow.status_code, follow.json()) == (200, 11)
    assert "ts_stream_next" not in follow.headers
    end(server, seq, 11)


def test_end_closes_the_sequence_and_frees_its_place(server: LanternServer) -> None:
    # maxNumSequence is 2: a third open sequence is refused until one of them ends.
    first, second = (predict(server, b"2").headers[SEQ] for _ in range(2))
    refused = predict(server, b"2")
    assert refused.status_code == 429, refused.text
    assert "maxNumSequence" in refused.json()["message"]
    end(server, first, 2)
    third = predict(server, b"2")
    assert third.status_code == 200, third.text
    end(server, second, 2)
    end(server, third.headers[SEQ], 2)
