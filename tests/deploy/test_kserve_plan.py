"""How `serve kserve` reads /mnt/models and picks its ports: table tests on temporary folders."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from serve.kserve.pod import PodContractError, plan_models, pod_overrides, port_from

KNOWN = frozenset({"grpc_inference_port", "grpc_inference_address"})


def archive(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PK")
    return path


def unpacked(folder: Path, name: str) -> Path:
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"model": {"modelName": name}}))
    return folder


def torchserve_layout(root: Path, properties: str) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "config" / "config.properties").write_text(properties)
    archive(root / "model-store" / "resnet.mar")
    return root


def test_torchserve_layout_with_a_model_snapshot_leaves_the_models_to_the_config(
    tmp_path: Path,
) -> None:
    snapshot = {"models": {"resnet": {"1.0": {"marName": "resnet.mar", "minWorkers": 1}}}}
    root = torchserve_layout(tmp_path / "m", f"model_snapshot={json.dumps(snapshot)}\n")
    plan = plan_models(root, "isvc")
    assert plan.layout == "torchserve"
    assert plan.ts_config == root / "config" / "config.properties"
    assert plan.model_store == (root / "model-store").resolve()
    assert plan.load_models == []


def test_torchserve_layout_without_models_serves_the_store(tmp_path: Path) -> None:
    root = torchserve_layout(tmp_path / "m", "job_queue_size=10\n")
    assert plan_models(root, "isvc").load_models == ["isvc=resnet.mar"]
    archive(root / "model-store" / "other.mar")
    assert plan_models(root, "isvc").load_models == ["other=other.mar", "resnet=resnet.mar"]


def test_torchserve_layout_needs_its_model_store(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.properties").write_text("")
    with pytest.raises(PodContractError, match="model-store"):
        plan_models(tmp_path, None)


@pytest.mark.parametrize(
    ("files", "name", "expected"),
    [
        (["a.mar"], "isvc", ["isvc=a.mar"]),
        (["a.mar"], None, ["a=a.mar"]),
        (["a.mar", "b.tar.gz"], "isvc", ["a=a.mar", "b=b.tar.gz"]),
        (["a.mar", ".hidden.mar", "notes.txt"], None, ["a=a.mar"]),
    ],
)
def test_bare_archives(
    tmp_path: Path, files: list[str], name: str | None, expected: list[str]
) -> None:
    for file in files:
        archive(tmp_path / file)
    plan = plan_models(tmp_path, name)
    assert (plan.layout, plan.load_models, plan.allowed_urls) == ("store", expected, [])


def test_a_symlinked_archive_is_allowed_by_its_exact_path_only(tmp_path: Path) -> None:
    real = archive(tmp_path / "bucket" / "a.b.mar")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    os.symlink(real, mnt / "a.b.mar")
    plan = plan_models(mnt, "isvc")
    assert plan.load_models == [f"isvc={real}"]
    (pattern,) = plan.allowed_urls
    assert re.fullmatch(pattern, str(real))
    assert not re.fullmatch(pattern, str(real).replace("a.b", "aXb"))  # the dot is literal


def test_an_unpacked_archive_as_the_model_folder(tmp_path: Path) -> None:
    folder = unpacked(tmp_path / "models", "from-manifest")
    assert plan_models(folder, None).load_models == ["from-manifest=models"]
    plan = plan_models(folder, "isvc")
    assert (plan.model_store, plan.load_models) == (tmp_path.resolve(), ["isvc=models"])


def test_unpacked_archives_inside_the_model_folder(tmp_path: Path) -> None:
    unpacked(tmp_path / "one", "first")
    unpacked(tmp_path / "two", "second")
    assert plan_models(tmp_path, "isvc").load_models == ["first=one", "second=two"]


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_no_model_is_a_clear_error(tmp_path: Path, make: str) -> None:
    folder = tmp_path / "models"
    if make == "empty":
        folder.mkdir()
    with pytest.raises(PodContractError, match=str(folder)):
        plan_models(folder, None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 8080), ("", 8080), ("9000", 9000), (8443, 8443), ("0", 0)],
)
def test_port_from(value: str | int | None, expected: int) -> None:
    assert port_from(value, 8080, "PORT") == expected


@pytest.mark.parametrize("value", ["8012", "8013", "8022", "9090", "9091", "http", "70000"])
def test_port_from_refuses_reserved_and_bad_ports(value: str) -> None:
    with pytest.raises(PodContractError, match="PORT"):
        port_from(value, 8080, "PORT")


def test_pod_overrides_bind_the_pod_ports(tmp_path: Path) -> None:
    plan = plan_models(archive(tmp_path / "a.mar").parent, "isvc")
    values = pod_overrides(plan, {"PORT": "9000"}, known_settings=KNOWN)
    assert values["inference_address"] == "http://0.0.0.0:9000"
    assert values["metrics_address"] == "http://0.0.0.0:8082"
    assert values["management_address"] == "http://127.0.0.1:8085"
    assert (values["grpc_inference_port"], values["grpc_inference_address"]) == (8081, "0.0.0.0")
    assert values["snapshot"] is False
    assert values["disable_token_authorization"] is True
    assert values["load_models"] == ["isvc=a.mar"]


def test_pod_overrides_leave_what_the_operator_set(tmp_path: Path) -> None:
    plan = plan_models(archive(tmp_path / "a.mar").parent, "isvc")
    env = {
        "LANTERN_METRICS_ADDRESS": "http://127.0.0.1:1",
        "LANTERN_DISABLE_TOKEN_AUTHORIZATION": "false",
    }
    values = pod_overrides(plan, env, http_port=7000, host="127.0.0.1")
    assert values["inference_address"] == "http://127.0.0.1:7000"
    assert "metrics_address" not in values
    assert "disable_token_authorization" not in values
    assert "grpc_inference_port" not in values  # a server without gRPC settings gets none


def test_token_setting_in_config_properties_is_kept(tmp_path: Path) -> None:
    root = torchserve_layout(tmp_path / "m", "disable_token_authorization=false\n")
    values = pod_overrides(plan_models(root, None), {})
    assert "disable_token_authorization" not in values
