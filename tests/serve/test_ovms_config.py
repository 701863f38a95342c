"""OVMS's config.json read into the loader's overlay (serve/store/ovms_config.py): tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serve.store.layouts import LayoutError, Overlay
from serve.store.ovms_config import OvmsModel, parse_ovms_config, read_ovms_config

ROOT = Path("/etc/ovms/config.json")


def one(config: dict[str, Any]) -> OvmsModel:
    (model,) = parse_ovms_config({"model_config_list": [{"config": config}]}, ROOT)
    return model


@pytest.mark.parametrize(
    ("config", "overlay", "not_honoured"),
    [
        ({"name": "m", "base_path": "/models/m"}, {}, ()),
        (
            {
                "name": "m",
                "base_path": "/models/m",
                "target_device": "AUTO",
                "plugin_config": {"PERFORMANCE_HINT": "LATENCY"},
                "nireq": 4,
            },
            {"openvino": {"device": "AUTO", "plugin_config": {"PERFORMANCE_HINT": "LATENCY"}}},
            ("nireq",),
        ),
        (
            {"name": "m", "base_path": "/m", "batch_size": "4", "shape": "(1,3,8,8)"},
            {"openvino": {"batch_size": 4, "shape": [1, 3, 8, 8]}},
            (),
        ),
        (
            {"name": "m", "base_path": "/m", "batch_size": "auto", "shape": {"x": "auto"}},
            {"openvino": {"batch_size": "auto", "shape": {"x": "auto"}}},
            (),
        ),
        (
            {
                "name": "m",
                "base_path": "/m",
                "model_version_policy": {"latest": {"num_versions": 2}},
                "layout": "NHWC:NCHW",
            },
            {"versionPolicy": {"latest": {"num_versions": 2}}},
            ("layout",),
        ),
    ],
)
def test_entries(
    config: dict[str, Any], overlay: dict[str, Any], not_honoured: tuple[str, ...]
) -> None:
    model = one(config)
    assert model.name == "m"
    assert model.overlay == Overlay(overlay, not_honoured)


def test_relative_base_path_is_the_config_files_folder() -> None:
    assert one({"name": "m", "base_path": "models/m"}).base_path == Path("/etc/ovms/models/m")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "no model_config_list"),
        ({"model_config_list": [{}]}, r"model_config_list\[0\] has no \"config\""),
        ({"model_config_list": [{"config": {"base_path": "/m"}}]}, "name"),
        ({"model_config_list": [{"config": {"name": "m"}}]}, "base_path"),
        (
            {"model_config_list": [{"config": {"name": "m", "base_path": "/m", "batch_size": 0}}]},
            "batch_size",
        ),
        (
            {"model_config_list": [{"config": {"name": "m", "base_path": "/m", "shape": "x"}}]},
            "shape",
        ),
        (
            {
                "model_config_list": [
                    {"config": {"name": "m", "base_path": "/a"}},
                    {"config": {"name": "m", "base_path": "/b"}},
                ]
            },
            "more than once",
        ),
    ],
)
def test_malformed_names_the_file(data: Any, message: str) -> None:
    with pytest.raises(LayoutError, match=message) as caught:
        parse_ovms_config(data, ROOT)
    assert str(ROOT) in str(caught.value)


def test_unreadable_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(LayoutError, match="config.json: cannot read the OVMS configuration"):
        read_ovms_config(path)
