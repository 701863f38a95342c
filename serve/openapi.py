"""OpenAPI 3.0.1 descriptions of the inference and management APIs (``OPTIONS /``)."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "description": "Error",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["code", "type", "message"],
                "properties": {
                    "code": {"type": "integer"},
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                },
            }
        }
    },
}

# (method, path, operationId, summary, query parameters, error codes)
_INFERENCE = [
    ("options", "/", "apiDescription", "Get the API description.", [], []),
    ("get", "/api-description", "apiDescriptionGet", "Get the API description.", [], []),
    (
        "get",
        "/ping",
        "ping",
        "Health: Healthy when every model has its minimum workers.",
        [],
        [500],
    ),
    (
        "post",
        "/predictions/{model_name}",
        "predictions",
        "Predict on the default version.",
        [],
        [400, 404, 413, 429, 500, 503, 504],
    ),
    (
        "post",
        "/predictions/{model_name}/{model_version}",
        "version_predictions",
        "Predict on a given version.",
        [],
        [400, 404, 413, 429, 500, 503, 504],
    ),
    (
        "post",
        "/explanations/{model_name}",
        "explanations",
        "Explain on the default version.",
        [],
        [400, 404, 413, 429, 500, 503, 504],
    ),
    (
        "post",
        "/explanations/{model_name}/{model_version}",
        "version_explanations",
        "Explain on a given version.",
        [],
        [400, 404, 413, 429, 500, 503, 504],
    ),
    (
        "post",
        "/v1/models/{model_name}:predict",
        "kserve_v1_predict",
        "KServe v1 predict.",
        [],
        [400, 404, 429, 500, 503, 504],
    ),
    (
        "post",
        "/v2/models/{model_name}/infer",
        "oip_infer",
        "Open Inference Protocol infer.",
        [],
        [400, 404, 429, 500, 503, 504],
    ),
]

_MANAGEMENT = [
    ("options", "/", "apiDescription", "Get the API description.", [], []),
    (
        "get",
        "/models",
        "listModels",
        "List registered models.",
        ["limit", "next_page_token"],
        [400],
    ),
    (
        "post",
        "/models",
        "registerModel",
        "Register a model archive.",
        [
            "url",
            "model_name",
            "handler",
            "runtime",
            "batch_size",
            "max_batch_delay",
            "initial_workers",
            "synchronous",
            "response_timeout",
            "startup_timeout",
        ],
        [400, 401, 404, 405, 409, 500],
    ),
    (
        "get",
        "/models/{model_name}",
        "describeModel",
        "Describe a model's default version.",
        ["customized"],
        [401, 404],
    ),
    (
        "put",
        "/models/{model_name}",
        "setAutoScale",
        "Scale a model's workers.",
        ["min_worker", "max_worker", "synchronous"],
        [400, 401, 404],
    ),
    (
        "delete",
        "/models/{model_name}",
        "unregisterModel",
        "Unregister a model.",
        [],
        [401, 403, 404, 405, 408],
    ),
    (
        "get",
        "/models/{model_name}/{model_version}",
        "describeModelVersion",
        "Describe a version (or all).",
        ["customized"],
        [401, 404],
    ),
    (
        "put",
        "/models/{model_name}/{model_version}",
        "setAutoScaleVersion",
        "Scale a version's workers.",
        ["min_worker", "max_worker", "synchronous"],
        [400, 401, 404],
    ),
    (
        "delete",
        "/models/{model_name}/{model_version}",
        "unregisterVersion",
        "Unregister a version.",
        [],
        [401, 403, 404, 405, 408],
    ),
    (
        "put",
        "/models/{model_name}/{model_version}/set-default",
        "setDefault",
        "Make a version the default.",
        [],
        [401, 404],
    ),
    ("get", "/token", "token", "Rotate a key (needs the API key).", ["type"], [400, 401]),
]


def _build(title: str, version: str, operations: list[tuple[Any, ...]]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for method, path, op_id, summary, query, errors in operations:
        params = [
            {"in": "path", "name": seg[1:-1], "required": True, "schema": {"type": "string"}}
            for seg in path.replace(":", "/").split("/")
            if seg.startswith("{")
        ]
        params += [
            {"in": "query", "name": q, "required": False, "schema": {"type": "string"}}
            for q in query
        ]
        responses: dict[str, Any] = {"200": {"description": "OK"}}
        responses.update({str(code): _ERROR for code in errors})
        paths.setdefault(path, {})[method] = {
            "operationId": op_id,
            "summary": summary,
            "parameters": params,
            "responses": responses,
        }
    return {"openapi": "3.0.1", "info": {"title": title, "version": version}, "paths": paths}


def inference_description(version: str) -> dict[str, Any]:
    return _build("Lantern Inference API", version, _INFERENCE)


def management_description(version: str) -> dict[str, Any]:
    return _build("Lantern Management API", version, _MANAGEMENT)
