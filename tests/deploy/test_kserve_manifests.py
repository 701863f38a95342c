"""deploy/kserve: the ServingRuntime, its cluster-wide twin and the InferenceService examples,
validated against KServe's CRD schemas, and the runtime's pod contract as written."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.support import DEPLOY, KNATIVE_RESERVED_PORTS, load_manifests, validate_custom

KSERVE = DEPLOY / "kserve"
MANIFESTS = sorted(KSERVE.glob("*.yaml"))


def runtime(name: str = "servingruntime.yaml") -> dict[str, Any]:
    (obj,) = load_manifests(KSERVE / name)
    return obj


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_its_crd(path: Any) -> None:
    for obj in load_manifests(path):
        validate_custom(obj)


def test_both_runtimes_are_the_same_but_for_their_scope() -> None:
    namespaced, cluster = runtime(), runtime("clusterservingruntime.yaml")
    assert (namespaced["kind"], cluster["kind"]) == ("ServingRuntime", "ClusterServingRuntime")
    assert namespaced["spec"] == cluster["spec"]
    assert namespaced["metadata"] == cluster["metadata"]


def test_runtime_declares_formats_protocols_and_metrics() -> None:
    spec = runtime()["spec"]
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"pytorch", "onnx"}
    assert spec["protocolVersions"] == ["v1", "v2", "grpc-v2"]
    assert spec["annotations"] == {
        "prometheus.kserve.io/port": "8082",
        "prometheus.kserve.io/path": "/metrics",
    }


def test_runtime_container_contract() -> None:
    (container,) = runtime()["spec"]["containers"]
    assert container["name"] == "kserve-container"
    assert container["command"] == ["serve"]
    assert container["args"] == ["kserve", "--model_name={{.Name}}", "--model_dir=/mnt/models"]
    env = {e["name"]: e["value"] for e in container["env"]}
    ports = {int(env[k]) for k in ("PORT", "GRPC_PORT", "METRICS_PORT")}
    ports |= {p["containerPort"] for p in container["ports"]}
    assert not ports & KNATIVE_RESERVED_PORTS
    assert int(env["LANTERN_DRAIN_TIMEOUT"]) < 30  # Kubernetes' default grace period
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["capabilities"]["drop"] == ["ALL"]
    assert security["allowPrivilegeEscalation"] is False
    assert set(container["resources"]) == {"requests", "limits"}


def test_inference_service_examples_cover_both_deployment_modes() -> None:
    modes = {}
    for path in KSERVE.glob("inferenceservice-*.yaml"):
        (isvc,) = load_manifests(path)
        assert isvc["spec"]["predictor"]["model"]["runtime"] == "lantern"
        modes[path.name] = isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"]
    assert set(modes.values()) == {"Standard", "Knative"}
    (standard,) = load_manifests(KSERVE / "inferenceservice-standard.yaml")
    (metric,) = standard["spec"]["predictor"]["autoScaling"]["metrics"]
    assert "serve_requests_in_flight" in metric["external"]["metric"]["query"]


def test_crd_check_rejects_a_misspelt_field() -> None:
    import jsonschema

    obj = runtime()
    obj["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(obj)
