"""A small typed client for Lantern (and TorchServe): HTTP or gRPC, blocking or asyncio.

    from serve.client import Client
    with Client(token="...", management_token="...") as lantern:       # HTTP, ports 8080/8081
        print(lantern.predict("resnet", open("kitten.jpg", "rb").read()))
    with Client(protocol="grpc") as lantern:                          # gRPC, ports 7070/7071
        outputs = lantern.infer("multi", {"x": np.ones((1, 4), np.float32)})

`Client` blocks; `AsyncClient` has the same methods as coroutines (``stream`` as an async
iterator). Each operation is described once, sans-IO (an `_Http` or `_Rpc` request and a parser);
the two classes only carry them out. Failures raise `ClientError` with the HTTP status or the gRPC
code. HTTP needs ``httpx`` (``pip install 'lantern-serve[client]'``); gRPC uses the server's own
dependencies. See ``docs/client.md``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from serve.wire.tensors import array_from_raw, datatype_of, raw_from_array

Protocol = Literal["http", "grpc"]
Data = bytes | str | Mapping[str, bytes | str]
_INFERENCE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
_MANAGEMENT = "org.pytorch.serve.grpc.management.ManagementAPIsService"
_OIP = "inference.GRPCInferenceService"


class ClientError(Exception):
    """A call the server refused: ``status`` (HTTP) or ``code`` (gRPC ``StatusCode`` name)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


# ----- the operations, sans-IO ----------------------------------------------------------------


@dataclass
class _Http:
    port: Literal["inference", "management"]
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    content: bytes | None = None
    files: dict[str, bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Rpc:
    port: Literal["inference", "management"]
    method: str  # /package.Service/Method
    request: Any
    response: Any  # the response message class


@dataclass
class _Op:
    http: _Http
    rpc: _Rpc
    parse_http: Callable[[Any], Any]  # an httpx.Response -> result
    parse_rpc: Callable[[Any], Any]  # a response message -> result


def _inputs(data: Data) -> dict[str, bytes]:
    if isinstance(data, (bytes, str)):
        data = {"data": data}
    return {k: v.encode() if isinstance(v, str) else bytes(v) for k, v in data.items()}


def _http_predict(model: str, version: str | None, data: Data) -> _Http:
    path = f"/predictions/{model}" + (f"/{version}" if version else "")
    inputs = _inputs(data)
    if list(inputs) == ["data"]:
        return _Http("inference", "POST", path, content=inputs["data"])
    return _Http("inference", "POST", path, files=inputs)


def _predict_op(model: str, version: str | None, data: Data) -> _Op:
    from serve.grpc.gen import inference_pb2 as pb

    request = pb.PredictionsRequest(model_name=model, model_version=version or "")
    request.input.update(_inputs(data))
    return _Op(
        _http_predict(model, version, data),
        _Rpc("inference", f"/{_INFERENCE}/Predictions", request, pb.PredictionResponse),
        lambda r: r.content,
        lambda m: m.prediction,
    )


def _infer_op(
    model: str, version: str | None, inputs: Mapping[str, np.ndarray], outputs: list[str] | None
) -> _Op:
    from serve.grpc.gen import open_inference_grpc_pb2 as pb

    arrays = {name: np.asarray(a) for name, a in inputs.items()}
    raws = {name: raw_from_array(a, datatype_of(a)) for name, a in arrays.items()}
    head: dict[str, Any] = {
        "inputs": [
            {
                "name": name,
                "datatype": datatype_of(a),
                "shape": list(a.shape),
                "parameters": {"binary_data_size": len(raws[name])},
            }
            for name, a in arrays.items()
        ]
    }
    if outputs is None:
        head["parameters"] = {"binary_data_output": True}
    else:
        head["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    header = json.dumps(head).encode()
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    http = _Http(
        "inference",
        "POST",
        path,
        content=header + b"".join(raws.values()),
        headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
    )
    request = pb.ModelInferRequest(model_name=model, model_version=version or "")
    for name, a in arrays.items():
        request.inputs.add(name=name, datatype=datatype_of(a), shape=list(a.shape))
        request.raw_input_contents.append(raws[name])
    for name in outputs or []:
        request.outputs.add(name=name)
    rpc = _Rpc("inference", f"/{_OIP}/ModelInfer", request, pb.ModelInferResponse)
    return _Op(http, rpc, _parse_http_infer, _parse_rpc_infer)


def _parse_http_infer(response: Any) -> dict[str, np.ndarray]:
    body = response.content
    length = response.headers.get("inference-header-content-length")
    head = json.loads(body[: int(length)] if length else body)
    offset = int(length) if length else 0
    out = {}
    for entry in head["outputs"]:
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is None:
            dtype = "object" if entry["datatype"] == "BYTES" else None
            array = np.array(entry["data"], dtype=dtype).reshape(entry["shape"])
        else:
            raw = body[offset : offset + size]
            offset += size
            array = array_from_raw(entry["datatype"], entry["shape"], raw)
        out[entry["name"]] = array
    return out


def _parse_rpc_infer(message: Any) -> dict[str, np.ndarray]:
    return {
        out.name: array_from_raw(out.datatype, list(out.shape), raw)
        for out, raw in zip(message.outputs, message.raw_output_contents, strict=True)
    }


def _status_text(response: Any) -> str:
    return str(response.json()["status"])


def _msg_json(message: Any) -> Any:
    return json.loads(message.msg)


def _status_op(http: _Http, rpc: _Rpc) -> _Op:
    """A management call whose answer is a status message (register, scale, set-default,
    unregister)."""
    return _Op(http, rpc, _status_text, lambda m: m.msg)


def _management_op(kind: str, **args: Any) -> _Op:
    """The six management calls; ``args`` are TorchServe's parameter names."""
    from serve.grpc.gen import management_pb2 as pb

    name, version = args.get("model_name", ""), args.get("model_version") or ""
    suffix = f"/{name}" + (f"/{version}" if version else "")

    def rpc(method: str, request: Any) -> _Rpc:
        return _Rpc("management", f"/{_MANAGEMENT}/{method}", request, pb.ManagementResponse)

    if kind == "list":
        params = {k: v for k, v in args.items() if v}
        return _Op(
            _Http("management", "GET", "/models", params=params),
            rpc("ListModels", pb.ListModelsRequest(**params)),
            lambda r: r.json(),
            _msg_json,
        )
    if kind == "describe":
        http_params = {"customized": "true"} if args.get("customized") else {}
        return _Op(
            _Http("management", "GET", f"/models{suffix}", params=http_params),
            rpc("DescribeModel", pb.DescribeModelRequest(**args)),
            lambda r: r.json(),
            _msg_json,
        )
    if kind == "register":
        params = {k: v for k, v in args.items() if v not in (None, "")}
        http_params = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
        return _status_op(
            _Http("management", "POST", "/models", params=http_params),
            rpc("RegisterModel", pb.RegisterModelRequest(**params)),
        )
    if kind == "scale":
        http_params = {
            "min_worker": args["min_worker"],
            "synchronous": str(args["synchronous"]).lower(),
        }
        if args.get("max_worker"):
            http_params["max_worker"] = args["max_worker"]
        return _status_op(
            _Http("management", "PUT", f"/models{suffix}", params=http_params),
            rpc("ScaleWorker", pb.ScaleWorkerRequest(**args)),
        )
    if kind == "set_default":
        return _status_op(
            _Http("management", "PUT", f"/models{suffix}/set-default"),
            rpc("SetDefault", pb.SetDefaultRequest(**args)),
        )
    if kind == "unregister":
        return _status_op(
            _Http("management", "DELETE", f"/models{suffix}"),
            rpc("UnregisterModel", pb.UnregisterModelRequest(**args)),
        )
    raise ValueError(kind)


def _http_error(response: Any) -> ClientError:
    try:
        body = response.json()
        message = body.get("message") or body.get("error") or response.text
    except ValueError:
        message = response.text
    return ClientError(str(message), status=response.status_code)


def _rpc_error(exc: Any) -> ClientError:
    return ClientError(exc.details() or "", code=exc.code().name)


# ----- the two clients ------------------------------------------------------------------------


class _Settings:
    def __init__(
        self,
        *,
        protocol: Protocol,
        inference: str | None,
        management: str | None,
        token: str | None,
        management_token: str | None,
        timeout: float | None,
    ) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError("protocol must be 'http' or 'grpc'")
        self.protocol = protocol
        if protocol == "http":
            self.addresses = {
                "inference": inference or "http://127.0.0.1:8080",
                "management": management or "http://127.0.0.1:8081",
            }
        else:
            self.addresses = {
                "inference": inference or "127.0.0.1:7070",
                "management": management or "127.0.0.1:7071",
            }
        self.tokens = {"inference": token, "management": management_token}
        self.timeout = timeout

    def http_headers(self, call: _Http) -> dict[str, str]:
        headers = dict(call.headers)
        if self.tokens[call.port]:
            headers["Authorization"] = f"Bearer {self.tokens[call.port]}"
        return headers

    def metadata(self, port: str) -> tuple[tuple[str, str], ...]:
        token = self.tokens[port]
        return (("authorization", f"Bearer {token}"),) if token else ()

    def url(self, call: _Http) -> str:
        return self.addresses[call.port].rstrip("/") + call.path


class _Base:
    """What both clients share: their settings, their connections, and how an operation becomes
    a gRPC call or an HTTP request (the two subclasses only carry them out, blocking or not)."""

    def __init__(
        self,
        *,
        protocol: Protocol = "http",
        inference: str | None = None,
        management: str | None = None,
        token: str | None = None,
        management_token: str | None = None,
        timeout: float | None = 60.0,
    ) -> None:
        self._s = _Settings(
            protocol=protocol,
            inference=inference,
            management=management,
            token=token,
            management_token=management_token,
            timeout=timeout,
        )
        self._http: Any = None
        self._channels: dict[str, Any] = {}

    def _channel(self, port: str) -> Any:
        raise NotImplementedError

    def _rpc_call(self, rpc: _Rpc, *, stream: bool = False) -> Any:
        """The channel's callable for ``rpc`` (``StreamPredictions`` for a stream)."""
        channel = self._channel(rpc.port)
        make, method = channel.unary_unary, rpc.method
        if stream:
            make = channel.unary_stream
            method = method.replace("/Predictions", "/StreamPredictions")
        return make(
            method,
            request_serializer=type(rpc.request).SerializeToString,
            response_deserializer=rpc.response.FromString,
        )

    def _http_args(self, http: _Http) -> dict[str, Any]:
        """The keyword arguments of ``httpx``'s ``request``/``stream`` for ``http``."""
        return {
            "method": http.method,
            "url": self._s.url(http),
            "params": http.params,
            "content": http.content,
            "files": http.files,
            "headers": self._s.http_headers(http),
        }


def _describe_op(model: str, version: str | None, customized: bool) -> _Op:
    return _management_op(
        "describe", model_name=model, model_version=version, customized=customized
    )


def _scale_op(
    model: str, min_worker: int, max_worker: int | None, version: str | None, synchronous: bool
) -> _Op:
    return _management_op(
        "scale",
        model_name=model,
        model_version=version,
        min_worker=min_worker,
        max_worker=max_worker or 0,
        synchronous=synchronous,
    )


class Client(_Base):
    """Blocking client. ``protocol`` picks HTTP (default) or gRPC for every call.

    ``inference``/``management``: the base URLs (HTTP) or ``host:port`` (gRPC), TorchServe's
    default ports when omitted. ``token``/``management_token``: the keys from ``key_file.json``.
    ``timeout``: seconds per call (the gRPC deadline, or the HTTP timeout).
    """

    # ----- inference -------------------------------------------------------------------------

    def predict(self, model: str, data: Data, *, version: str | None = None) -> bytes:
        """TorchServe's prediction: ``data`` is the body (or named inputs); the answer's bytes."""
        return self._run(_predict_op(model, version, data))

    def stream(self, model: str, data: Data, *, version: str | None = None) -> Iterator[bytes]:
        """A streaming handler's responses, each as it arrives."""
        op = _predict_op(model, version, data)
        if self._s.protocol == "grpc":
            call = self._rpc_call(op.rpc, stream=True)
            try:
                for message in call(op.rpc.request, metadata=self._s.metadata(op.rpc.port)):
                    yield message.prediction
            except Exception as exc:
                raise self._maybe_rpc_error(exc) from exc
            return
        with self._http_client().stream(**self._http_args(op.http)) as response:
            if response.status_code >= 400:
                response.read()
                raise _http_error(response)
            yield from response.iter_bytes()

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | None = None,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Open Inference Protocol inference: numpy arrays in and out (binary tensors)."""
        return self._run(_infer_op(model, version, inputs, outputs))

    # ----- management ------------------------------------------------------------------------

    def list_models(self, *, limit: int = 0, next_page_token: int = 0) -> dict[str, Any]:
        return self._run(_management_op("list", limit=limit, next_page_token=next_page_token))

    def describe(
        self, model: str, *, version: str | None = None, customized: bool = False
    ) -> list[dict[str, Any]]:
        return self._run(_describe_op(model, version, customized))

    def register(self, url: str, **params: Any) -> str:
        """Register an archive; ``params`` are TorchServe's (``model_name``, ``initial_workers``,
        ``synchronous``, ``batch_size``, ...). Returns the status message."""
        return self._run(_management_op("register", url=url, **params))

    def scale(
        self,
        model: str,
        min_worker: int,
        *,
        max_worker: int | None = None,
        version: str | None = None,
        synchronous: bool = True,
    ) -> str:
        return self._run(_scale_op(model, min_worker, max_worker, version, synchronous))

    def set_default(self, model: str, version: str) -> str:
        return self._run(_management_op("set_default", model_name=model, model_version=version))

    def unregister(self, model: str, *, version: str | None = None) -> str:
        return self._run(_management_op("unregister", model_name=model, model_version=version))

    # ----- transport -------------------------------------------------------------------------

    def _run(self, op: _Op) -> Any:
        if self._s.protocol == "grpc":
            rpc = op.rpc
            try:
                message = self._rpc_call(rpc)(
                    rpc.request, metadata=self._s.metadata(rpc.port), timeout=self._s.timeout
                )
            except Exception as exc:
                raise self._maybe_rpc_error(exc) from exc
            return op.parse_rpc(message)
        response = self._http_client().request(**self._http_args(op.http))
        if response.status_code >= 400:
            raise _http_error(response)
        return op.parse_http(response)

    @staticmethod
    def _maybe_rpc_error(exc: Exception) -> Exception:
        import grpc

        return _rpc_error(exc) if isinstance(exc, grpc.RpcError) else exc

    def _http_client(self) -> Any:
        if self._http is None:
            import httpx

            self._http = httpx.Client(timeout=self._s.timeout)
        return self._http

    def _channel(self, port: str) -> Any:
        if port not in self._channels:
            import grpc

            self._channels[port] = grpc.insecure_channel(self._s.addresses[port])
        return self._channels[port]

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    """`Client`'s methods as coroutines, on ``httpx.AsyncClient`` or ``grpc.aio`` channels."""

    async def predict(self, model: str, data: Data, *, version: str | None = None) -> bytes:
        return await self._run(_predict_op(model, version, data))

    async def stream(
        self, model: str, data: Data, *, version: str | None = None
    ) -> AsyncIterator[bytes]:
        op = _predict_op(model, version, data)
        if self._s.protocol == "grpc":
            import grpc

            call = self._rpc_call(op.rpc, stream=True)
            try:
                async for message in call(op.rpc.request, metadata=self._s.metadata(op.rpc.port)):
                    yield message.prediction
            except grpc.RpcError as exc:
                raise _rpc_error(exc) from exc
            return
        async with self._http_client().stream(**self._http_args(op.http)) as response:
            if response.status_code >= 400:
                await response.aread()
                raise _http_error(response)
            async for chunk in response.aiter_bytes():
                yield chunk

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | None = None,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        return await self._run(_infer_op(model, version, inputs, outputs))

    async def list_models(self, *, limit: int = 0, next_page_token: int = 0) -> dict[str, Any]:
        return await self._run(_management_op("list", limit=limit, next_page_token=next_page_token))

    async def describe(
        self, model: str, *, version: str | None = None, customized: bool = False
    ) -> list[dict[str, Any]]:
        return await self._run(_describe_op(model, version, customized))

    async def register(self, url: str, **params: Any) -> str:
        return await self._run(_management_op("register", url=url, **params))

    async def scale(
        self,
        model: str,
        min_worker: int,
        *,
        max_worker: int | None = None,
        version: str | None = None,
        synchronous: bool = True,
    ) -> str:
        return await self._run(_scale_op(model, min_worker, max_worker, version, synchronous))

    async def set_default(self, model: str, version: str) -> str:
        op = _management_op("set_default", model_name=model, model_version=version)
        return await self._run(op)

    async def unregister(self, model: str, *, version: str | None = None) -> str:
        op = _management_op("unregister", model_name=model, model_version=version)
        return await self._run(op)

    async def _run(self, op: _Op) -> Any:
        if self._s.protocol == "grpc":
            import grpc

            rpc = op.rpc
            try:
                message = await self._rpc_call(rpc)(
                    rpc.request, metadata=self._s.metadata(rpc.port), timeout=self._s.timeout
                )
            except grpc.RpcError as exc:
                raise _rpc_error(exc) from exc
            return op.parse_rpc(message)
        response = await self._http_client().request(**self._http_args(op.http))
        if response.status_code >= 400:
            raise _http_error(response)
        return op.parse_http(response)

    def _http_client(self) -> Any:
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(timeout=self._s.timeout)
        return self._http

    def _channel(self, port: str) -> Any:
        if port not in self._channels:
            import grpc

            self._channels[port] = grpc.aio.insecure_channel(self._s.addresses[port])
        return self._channels[port]

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
