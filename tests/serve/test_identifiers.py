"""Identifier bounds (issue 27, item 8): cut in messages, absurd ones refused."""

from __future__ import annotations

import asyncio

import pytest

from serve.config import Config
from serve.core.registry import Registry
from serve.identifiers import MAX_SEQUENCE_ID, SHOWN, check_length, shown
from serve.metrics.prometheus import ServerMetrics
from serve.wire.errors import BadRequest, ModelNotFound
from tests.serve.test_sequences import FakeWorker, item, make, summing


def test_shown_cuts_with_an_ellipsis() -> None:
    assert shown("short") == "short"
    cut = shown("x" * 5000)
    assert len(cut) == SHOWN and cut.endswith("…")


def test_check_length_names_the_bound_and_not_the_whole_value() -> None:
    check_length("a" * 10, "model name", 10)
    with pytest.raises(BadRequest) as info:
        check_length("a" * 1_000_000, "model name", 10)
    assert "1000000 characters long; at most 10" in info.value.message
    assert len(info.value.message) < 200


def test_a_missing_models_name_is_cut_in_the_404(tmp_path) -> None:
    config = Config(model_store=str(tmp_path), snapshot=False)
    registry = Registry(config, tmp_path / "work", ServerMetrics())
    with pytest.raises(ModelNotFound) as info:
        registry.get("m" * 3_000_000)
    assert len(info.value.message) < 200


def test_an_http_sequence_id_past_the_bound_is_refused() -> None:
    async def run() -> None:
        d = make([FakeWorker("w0", summing({}))])
        with pytest.raises(BadRequest, match=f"at most {MAX_SEQUENCE_ID}"):
            d.submit(item("r1", 1, "s" * (MAX_SEQUENCE_ID + 1)))
        assert (await d.submit(item("r2", 1, "s" * MAX_SEQUENCE_ID))).body == b"1"

    asyncio.run(run())
