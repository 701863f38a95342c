"""The Helm chart, checked offline: ``helm lint --strict``, ``helm template`` with the default,
the maximal and the KEDA values, every built-in object through ``kubernetes-validate --strict``
and every custom resource against its CRD's schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.deploy.support import (
    CHART,
    KNATIVE_RESERVED_PORTS,
    is_custom,
    kubernetes_validate,
    render,
    run_helm,
    validate_custom,
)

MAX_VALUES = CHART / "ci" / "max-values.yaml"
KEDA_VALUES = CHART / "ci" / "keda-values.yaml"
VALUES = {"default": (), "max": (MAX_VALUES,), "keda": (KEDA_VALUES,)}


@pytest.fixture(scope="module", params=sorted(VALUES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(*VALUES[request.param])


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(objects, "Deployment")
    (lantern,) = deployment["spec"]["template"]["spec"]["containers"]
    return lantern


@pytest.mark.parametrize("values", sorted(VALUES))
def test_helm_lint_strict(values: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in VALUES[values]:
        args += ["-f", str(path)]
    result = run_helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_every_object_validates(rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    _, objects = rendered
    builtin = [o for o in objects if not is_custom(o)]
    kubernetes_validate(builtin, tmp_path)
    for obj in objects:
        if is_custom(obj):
            validate_custom(obj)


def test_the_custom_resource_check_rejects_a_typo() -> None:
    objects = render(MAX_VALUES, KEDA_VALUES)
    (scaled,) = by_kind(objects, "ScaledObject")
    scaled["spec"]["minReplicaCont"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(scaled)


def test_kubernetes_validate_fails_on_an_unknown_field(tmp_path: Path) -> None:
    objects = render()
    (deployment,) = by_kind(objects, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(AssertionError):
        kubernetes_validate([deployment], tmp_path)


def test_default_release_objects() -> None:
    objects = render()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    lantern = container(objects)
    assert lantern["command"] == ["serve"]
    assert lantern["args"][:2] == ["start", "--foreground"]
    assert "--disable-token-auth" not in lantern["args"]  # token auth is on by default
    env = {e["name"]: e.get("value") for e in lantern["env"]}
    assert env["LANTERN_MANAGEMENT_ADDRESS"].startswith("http://127.0.0.1:")  # not exposed
    assert (
        int(env["LANTERN_DRAIN_TIMEOUT"])
        < by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ]
    )
    assert lantern["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert lantern["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = lantern["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # slow loads survive
    security = lantern["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["allowPrivilegeEscalation"] is False
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_no_knative_reserved_port(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    ports = {p["containerPort"] for p in container(objects)["ports"]}
    for service in by_kind(objects, "Service"):
        ports |= {p["port"] for p in service["spec"]["ports"]}
    assert ports and not ports & KNATIVE_RESERVED_PORTS


def test_maximal_values() -> None:
    objects = render(MAX_VALUES)
    kinds = {o["kind"] for o in objects}
    assert {"HorizontalPodAutoscaler", "ServiceMonitor", "PodDisruptionBudget"} <= kinds
    assert "ScaledObject" not in kinds
    lantern = container(objects)
    assert lantern["resources"]["limits"]["nvidia.com/gpu"] == 1
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in lantern["env"]
        if "valueFrom" in e
    }
    assert secrets == {
        "LANTERN_INFERENCE_KEY": "lantern-keys",
        "LANTERN_MANAGEMENT_KEY": "lantern-keys",
        "LANTERN_API_KEY": "lantern-keys",
    }
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["initContainers"][0]["volumeMounts"][0]["name"] == "model-store"
    (hpa,) = by_kind(objects, "HorizontalPodAutoscaler")
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    assert metrics["Pods"]["pods"]["metric"]["name"] == "lantern_requests_in_flight"
    assert "replicas" not in by_kind(objects, "Deployment")[0]["spec"]  # the HPA owns it


def test_keda_replaces_the_hpa() -> None:
    objects = render(KEDA_VALUES, namespace="ml")
    kinds = {o["kind"] for o in objects}
    assert "ScaledObject" in kinds and "HorizontalPodAutoscaler" not in kinds
    (scaled,) = by_kind(objects, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    assert query == 'sum(serve_requests_in_flight{namespace="ml", service="rel-lantern"})'
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    (store,) = [v for v in pod["volumes"] if v["name"] == "model-store"]
    assert store["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert "--disable-token-auth" in container(objects)["args"]


def test_config_map_carries_both_config_files() -> None:
    (config_map,) = by_kind(render(MAX_VALUES), "ConfigMap")
    properties = config_map["data"]["config.properties"]
    assert "batch_size=8" in properties.splitlines()
    import yaml

    assert yaml.safe_load(config_map["data"]["config.yaml"]) == {
        "default_response_timeout": 60,
        "access_log": True,
    }


def test_rendered_config_files_are_accepted_by_lantern(tmp_path: Path) -> None:
    from serve.config import Config

    (config_map,) = by_kind(render(MAX_VALUES), "ConfigMap")
    (tmp_path / "config.properties").write_text(config_map["data"]["config.properties"])
    (tmp_path / "config.yaml").write_text(config_map["data"]["config.yaml"])
    config = Config.load(
        config_file=tmp_path / "config.yaml",
        ts_config_file=tmp_path / "config.properties",
        env={},
    )
    assert (config.batch_size, config.job_queue_size, config.default_workers_per_model) == (
        8,
        200,
        2,
    )
    assert config.default_response_timeout == 60
