"""Predictions whose result is raw bytes with no type from the handler: no Content-Type."""

from __future__ import annotations

from serve.core.jobs import ItemResult
from serve.http.inference import _result_response


def test_raw_bytes_without_a_type_go_without_content_type() -> None:
    """TorchServe's frontend sets Content-Type only when the handler gave one."""
    response = _result_response(ItemResult(200, b"\x00raw", None), "rid", 1 << 20)
    assert "content-type" not in response.headers
    assert response.body == b"\x00raw"


def test_a_type_from_the_handler_or_the_encoder_is_sent() -> None:
    response = _result_response(ItemResult(200, b"{}", "application/json"), "rid", 1 << 20)
    assert response.headers["content-type"] == "application/json"
    png = _result_response(ItemResult(200, b"...", "image/png"), "rid", 1 << 20)
    assert png.headers["content-type"] == "image/png"
