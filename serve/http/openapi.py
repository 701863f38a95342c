"""OpenAPI 3.0.1 descriptions of the inference, management and metrics APIs (``OPTIONS /``)."""

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
_INFERENCE: list[tuple[Any, ...]] = [
    ("options", "/", "apiDescription", "Get the API description.", [], []),
    ("get", "/api-description", "apiDescriptionGet", "Get the API description.", [], []),
    ("get", "/health", "health", "Health as vLLM answers it: an empty 200, or 503.", [], [503]),
    ("get", "/version", "version", "The server's version (vLLM's route).", [], []),
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
    (
        "post",
        "/v2/models/{model_name}/explain",
        "oip_explain",
        "Open Inference Protocol explain (KServe's explainer route).",
        [],
        [400, 404, 429, 500, 501, 503, 504],
    ),
]

# Health and metadata of the Open Inference Protocol (KServe v2), always served.
_OIP_HEALTH: list[tuple[Any, ...]] = [
    ("get", "/v2", "oip_server_metadata", "Open Inference Protocol server metadata.", [], []),
    ("get", "/v2/health/live", "oip_live", "Open Inference Protocol liveness.", [], []),
    ("get", "/v2/health/ready", "oip_ready", "Open Inference Protocol readiness.", [], [503]),
    (
        "get",
        "/v2/models/{model_name}/ready",
        "oip_model_ready",
        "Open Inference Protocol: is the model ready.",
        [],
        [404, 503],
    ),
]

# The generative routes (``enable_openai_api``): OpenAI's under /v1 (and /openai/v1) and the
# Open Inference Protocol's generate extension; docs/llm.md.
_OPENAI_ERRORS = [400, 401, 404, 413, 429, 500, 503, 504, 507]
_GENERATIVE: list[tuple[Any, ...]] = [
    (
        "post",
        "/v1/completions",
        "openai_completions",
        "OpenAI completions (streamed with stream: true, as server-sent events).",
        [],
        _OPENAI_ERRORS,
    ),
    (
        "post",
        "/v1/chat/completions",
        "openai_chat_completions",
        "OpenAI chat completions (streamed with stream: true, as server-sent events).",
        [],
        _OPENAI_ERRORS,
    ),
    ("post", "/v1/embeddings", "openai_embeddings", "OpenAI embeddings.", [], _OPENAI_ERRORS),
    ("get", "/openai/v1/models", "openai_models", "OpenAI: the models served.", [], []),
    (
        "get",
        "/openai/v1/models/{model_name}",
        "openai_model",
        "OpenAI: one model (also /v1/models for OpenAI clients).",
        [],
        [404],
    ),
    (
        "post",
        "/v2/models/{model_name}/generate",
        "oip_generate",
        "Open Inference Protocol generate: one answer.",
        [],
        [400, 404, 429, 500, 503, 504],
    ),
    (
        "post",
        "/v2/models/{model_name}/generate_stream",
        "oip_generate_stream",
        "Open Inference Protocol generate: the answer as server-sent events.",
        [],
        [400, 404, 429, 500, 503, 504],
    ),
]

# The metrics port's one route, as TorchServe describes it there.
_METRICS: list[tuple[Any, ...]] = [
    ("options", "/", "apiDescription", "Get the API description.", [], []),
    (
        "get",
        "/metrics",
        "metrics",
        "Metrics in the Prometheus text format; name[] selects metric families.",
        ["name[]"],
        [500],
    ),
]

_REGISTER_PARAMS = [
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
]
_SCALE_PARAMS = ["min_worker", "max_worker", "synchronous", "model_version"]
_DESCRIBE = "Describe a version (`all`: every version) with its workers and queue."

# (method, path, operationId, summary, query parameters, error codes[, other success codes])
_MANAGEMENT: list[tuple[Any, ...]] = [
    ("options", "/", "apiDescription", "Get the API description.", [], []),
    ("get", "/api-description", "apiDescriptionGet", "Get the API description.", [], []),
    (
        "get",
        "/models",
        "listModels",
        "List registered models (default versions, by name, paged).",
        ["limit", "next_page_token"],
        [400, 401],
    ),
    (
        "post",
        "/models",
        "registerModel",
        "Register a model archive (query parameters or a JSON body with the same keys).",
        _REGISTER_PARAMS,
        [400, 401, 404, 405, 409, 500],
        [202, 206],
    ),
    (
        "get",
        "/models/{model_name}",
        "describeModel",
        "Describe a model's default version.",
        ["customized"],
        [401, 404, 503],
    ),
    (
        "put",
        "/models/{model_name}",
        "setAutoScale",
        "Scale a model's default version up or down.",
        _SCALE_PARAMS,
        [400, 401, 404, 500],
        [202, 206],
    ),
    (
        "delete",
        "/models/{model_name}",
        "unregisterModel",
        "Unregister a model's default version (drains its requests first).",
        [],
        [401, 403, 404, 405],
    ),
    (
        "options",
        "/models/{model_name}",
        "modelApiDescription",
        "Get the API description.",
        [],
        [401, 404],
    ),
    (
        "get",
        "/models/{model_name}/{model_version}",
        "describeModelVersion",
        _DESCRIBE,
        ["customized"],
        [401, 404, 503],
    ),
    (
        "put",
        "/models/{model_name}/{model_version}",
        "setAutoScaleVersion",
        "Scale a version up or down.",
        _SCALE_PARAMS,
        [400, 401, 404, 500],
        [202, 206],
    ),
    (
        "delete",
        "/models/{model_name}/{model_version}",
        "unregisterVersion",
        "Unregister a version (drains its requests first).",
        [],
        [401, 403, 404, 405],
    ),
    (
        "put",
        "/models/{model_name}/{model_version}/set-default",
        "setDefault",
        "Make a version the default.",
        [],
        [401, 404],
    ),
    (
        "get",
        "/v1/models/{model_name}",
        "modelReady",
        "KServe v1 readiness: {name, ready}.",
        [],
        [404],
    ),
    (
        "get",
        "/token",
        "token",
        "Replace the management or inference key (needs the API key).",
        ["type"],
        [400, 401],
    ),
]

_INTEGER_PARAMS = {
    "limit",
    "next_page_token",
    "batch_size",
    "max_batch_delay",
    "initial_workers",
    "response_timeout",
    "startup_timeout",
    "min_worker",
    "max_worker",
}
_BOOLEAN_PARAMS = {"synchronous", "customized"}


def _schema(name: str) -> dict[str, str]:
    if name in _INTEGER_PARAMS:
        return {"type": "integer"}
    if name in _BOOLEAN_PARAMS:
        return {"type": "boolean"}
    return {"type": "string"}


_SUCCESS = {
    202: {"description": "Accepted: workers are being started or stopped"},
    206: {"description": "Workers scaling in progress"},
}
_REGISTER_BODY = {
    "required": False,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["url"],
                "properties": {name: _schema(name) for name in _REGISTER_PARAMS},
            }
        }
    },
}


# What the inference routes take: any body for the TorchServe routes (the handler decides), the
# KServe v1 / TF Serving predict object, and the Open Inference Protocol's inference request.
_ANY_BODY = {
    "required": False,
    "content": {
        "application/json": {"schema": {}},
        "text/plain": {"schema": {"type": "string"}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    },
}
_V1_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"instances": {"type": "array"}, "inputs": {}},
            }
        }
    },
}
_OIP_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "datatype": {
            "type": "string",
            "enum": ["BOOL", "UINT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"],
        },
        "parameters": {"type": "object"},
        "data": {"type": "array"},
    },
}
_OIP_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["inputs"],
                "properties": {
                    "id": {"type": "string"},
                    "parameters": {"type": "object"},
                    "inputs": {"type": "array", "items": _OIP_TENSOR},
                    "outputs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "parameters": {"type": "object"},
                            },
                        },
                    },
                },
            }
        }
    },
}


def _json_body(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "required": required, "properties": properties}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {"role": {"type": "string"}, "content": {}},
}
_SAMPLING = {
    "max_tokens": {"type": "integer"},
    "temperature": {"type": "number"},
    "top_p": {"type": "number"},
    "stop": {},
    "stream": {"type": "boolean"},
    "seed": {"type": "integer"},
}
_BODIES: dict[str, dict[str, Any]] = {
    "openai_completions": _json_body(
        ["model", "prompt"], {"model": {"type": "string"}, "prompt": {}, **_SAMPLING}
    ),
    "openai_chat_completions": _json_body(
        ["model", "messages"],
        {
            "model": {"type": "string"},
            "messages": {"type": "array", "items": _MESSAGE},
            **_SAMPLING,
        },
    ),
    "openai_embeddings": _json_body(["model", "input"], {"model": {"type": "string"}, "input": {}}),
    "oip_generate": _json_body(
        ["text_input"], {"text_input": {"type": "string"}, "parameters": {"type": "object"}}
    ),
    "oip_generate_stream": _json_body(
        ["text_input"], {"text_input": {"type": "string"}, "parameters": {"type": "object"}}
    ),
    "predictions": _ANY_BODY,
    "version_predictions": _ANY_BODY,
    "explanations": _ANY_BODY,
    "version_explanations": _ANY_BODY,
    "kserve_v1_predict": _V1_BODY,
    "oip_infer": _OIP_BODY,
    "oip_explain": _OIP_BODY,
}


def _build(title: str, version: str, operations: list[tuple[Any, ...]]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for method, path, op_id, summary, query, errors, *more in operations:
        params = [
            {"in": "path", "name": seg[1:-1], "required": True, "schema": {"type": "string"}}
            for seg in path.replace(":", "/").split("/")
            if seg.startswith("{")
        ]
        params += [
            {"in": "query", "name": q, "required": False, "schema": _schema(q)} for q in query
        ]
        responses: dict[str, Any] = {"200": {"description": "OK"}}
        responses.update({str(code): _SUCCESS[code] for code in (more or [[]])[0]})
        responses.update({str(code): _ERROR for code in errors})
        operation: dict[str, Any] = {
            "operationId": op_id,
            "summary": summary,
            "parameters": params,
            "responses": responses,
        }
        if op_id == "registerModel":
            operation["requestBody"] = _REGISTER_BODY
        elif op_id in _BODIES:
            operation["requestBody"] = _BODIES[op_id]
        paths.setdefault(path, {})[method] = operation
    return {"openapi": "3.0.1", "info": {"title": title, "version": version}, "paths": paths}


def inference_description(version: str, *, generative: bool = True) -> dict[str, Any]:
    """The inference port's routes; the OpenAI and generate routes when they are served
    (``enable_openai_api``)."""
    operations = _INFERENCE + _OIP_HEALTH + (_GENERATIVE if generative else [])
    return _build("Lantern Inference API", version, operations)


def management_description(version: str) -> dict[str, Any]:
    return _build("Lantern Management API", version, _MANAGEMENT)


def metrics_description(version: str) -> dict[str, Any]:
    return _build("Lantern Metrics API", version, _METRICS)
