"""TF Serving's gRPC API: ``tensorflow.serving.PredictionService`` and ``ModelService``.

Served on the inference port beside TorchServe's and the OIP services, with TF Serving's own
messages (``serve/grpc/gen/tensorflow_serving``). A ``Predict`` is an OIP request underneath: its
``TensorProto`` inputs become raw tensors (``serve/grpc/tfs_codec.py``) and take
``serve.http.protocols.run_oip``, the path HTTP and gRPC OIP requests take, to the same worker
batching. ``Classify`` and ``Regress`` map their ``tf.Example`` features onto the model's inputs
(``serve/wire/tfserving.py``). Versions: ``ModelSpec.version`` (0 or unset: the default version),
``version_label`` (``VersionLabels``), and one signature per model, ``serving_default``. Errors
are `ServeError`s answered by ``Methods`` with the code TF Serving uses
(``serve/grpc/errors.py``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from serve.core.model import ModelVersion
from serve.core.version_labels import resolve
from serve.grpc.calls import Call, Methods, UnaryFn, decoder
from serve.grpc.gen.tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)
from serve.grpc.gen.xla.tsl.protobuf import error_codes_pb2
from serve.grpc.tfs_codec import tensor_from_proto, tensor_to_proto
from serve.http.common import ServerState
from serve.http.protocols import model_metadata, model_state, run_oip
from serve.wire import OIP, PROTOCOL_HEADER
from serve.wire.errors import BadRequest, ServeError
from serve.wire.oip import InferRequest, RequestedOutput
from serve.wire.tensor_params import Tensor
from serve.wire.tfserving import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    REGRESS_METHOD,
    Feature,
    check_signature,
    classifications,
    examples_to_tensors,
    numeric_version,
    regressions,
    signature_def,
)

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
SERVICES = (PREDICTION_SERVICE, MODEL_SERVICE)
_STATES = get_model_status_pb2.ModelVersionStatus.State


@dataclass(frozen=True)
class Origin:
    """Who asks: a call's request id, headers and deadline, or a warm-up replay's."""

    request_id: str
    headers: dict[str, str]
    timeout: float | None = None

    @classmethod
    def of(cls, call: Call) -> Origin:
        return cls(call.request_id, call.headers(), call.timeout())


class TfServingService:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    def handlers(self, methods: Methods) -> dict[str, dict[str, Any]]:
        """Each service's method handlers, by service name."""
        import grpc

        tables: dict[str, dict[str, tuple[UnaryFn, type[Message], type[Message]]]] = {
            PREDICTION_SERVICE: {
                "Predict": (self.predict, predict_pb2.PredictRequest, predict_pb2.PredictResponse),
                "GetModelMetadata": (
                    self.get_model_metadata,
                    get_model_metadata_pb2.GetModelMetadataRequest,
                    get_model_metadata_pb2.GetModelMetadataResponse,
                ),
                "Classify": (
                    self.classify,
                    classification_pb2.ClassificationRequest,
                    classification_pb2.ClassificationResponse,
                ),
                "Regress": (
                    self.regress,
                    regression_pb2.RegressionRequest,
                    regression_pb2.RegressionResponse,
                ),
                "MultiInference": (
                    self.multi_inference,
                    inference_pb2.MultiInferenceRequest,
                    inference_pb2.MultiInferenceResponse,
                ),
            },
            MODEL_SERVICE: {
                "GetModelStatus": (
                    self.get_model_status,
                    get_model_status_pb2.GetModelStatusRequest,
                    get_model_status_pb2.GetModelStatusResponse,
                ),
                "HandleReloadConfigRequest": (
                    self.reload_config,
                    model_management_pb2.ReloadConfigRequest,
                    model_management_pb2.ReloadConfigResponse,
                ),
            },
        }
        return {
            service: {
                name: grpc.unary_unary_rpc_method_handler(
                    methods.unary(f"/{service}/{name}", fn),
                    request_deserializer=decoder(request),
                    response_serializer=response.SerializeToString,
                )
                for name, (fn, request, response) in table.items()
            }
            for service, table in tables.items()
        }

    # ----- models and versions -------------------------------------------------------------

    def _model(self, call: Call, spec: Any) -> ModelVersion:
        if not spec.name:
            raise BadRequest("Missing ModelSpec")
        choice = spec.WhichOneof("version_choice")
        version = str(spec.version.value) if choice == "version" else None
        label = spec.version_label if choice == "version_label" else None
        call.label(spec.name, version or label)
        model = resolve(self.registry, self.state.labels, spec.name, version, label)
        call.label(model.name, model.version)
        return model

    def _spec(self, model: ModelVersion, signature: str) -> Any:
        spec = model_pb2.ModelSpec(name=model.name, signature_name=signature)
        number = numeric_version(model.version)
        if number is not None:
            spec.version.value = number
        return spec

    async def _counted(self, model: ModelVersion, run: Callable[[], Awaitable[Any]]) -> Any:
        """``run()``, counted in the model's request metrics as the OIP edge counts."""
        started = time.perf_counter()
        status = 500
        try:
            result = await run()
            status = 200
            return result
        except ServeError as err:
            status = err.status_code
            raise
        finally:
            self.state.metrics.request_done(
                model.name, model.version, status, time.perf_counter() - started
            )

    async def _run(self, origin: Origin, model: ModelVersion, infer: InferRequest) -> list[Tensor]:
        headers = {**origin.headers, PROTOCOL_HEADER: OIP}
        return await run_oip(model, origin.request_id, headers, infer, origin.timeout)

    # ----- PredictionService ---------------------------------------------------------------

    async def predict(self, call: Call, request: Any) -> Any:
        model = self._model(call, request.model_spec)
        return await self.predict_on(model, request, Origin.of(call))

    async def predict_on(self, model: ModelVersion, request: Any, origin: Origin) -> Any:
        """A ``PredictRequest`` answered by ``model`` (its ``model_spec`` already resolved)."""
        signature = check_signature(request.model_spec.signature_name)
        inputs = [tensor_from_proto(name, request.inputs[name]) for name in sorted(request.inputs)]
        if not inputs:
            raise BadRequest("input size does not match signature: 0 inputs were sent")
        wanted = list(request.output_filter)
        for i, name in enumerate(wanted):
            if name in wanted[:i]:
                raise BadRequest(f"duplicate output tensor alias: {name}")
        outputs = [RequestedOutput(n) for n in wanted] if wanted else None
        infer = InferRequest(None, {}, inputs, outputs, True, None)

        async def run() -> Any:
            if wanted:
                await self._check_outputs(origin, model, wanted)
            tensors = await self._run(origin, model, infer)
            response = predict_pb2.PredictResponse(model_spec=self._spec(model, signature))
            for tensor in tensors:
                if not wanted or tensor.name in wanted:
                    tensor_to_proto(tensor, response.outputs[tensor.name])
            return response

        return await self._counted(model, run)

    async def _check_outputs(self, origin: Origin, model: ModelVersion, wanted: list[str]) -> None:
        """``output_filter`` names against the model's outputs, in TF Serving's words."""
        metadata = await model_metadata(model, origin.request_id)
        known = [str(e.get("name")) for e in metadata.get("outputs") or []]
        for name in wanted:
            if known and name not in known:
                raise BadRequest(
                    f"output tensor alias not found in signature: {name} Outputs expected to "
                    f"be in the set {{{','.join(sorted(known))}}}."
                )

    async def get_model_metadata(self, call: Call, request: Any) -> Any:
        model = self._model(call, request.model_spec)
        fields = list(request.metadata_field)
        if not fields:
            raise BadRequest("GetModelMetadataRequest must specify at least one metadata_field")
        for field in fields:
            if field != "signature_def":
                raise BadRequest(f"Metadata field {field} is not supported")
        metadata = await model_metadata(model, call.request_id)
        response = get_model_metadata_pb2.GetModelMetadataResponse(model_spec=self._spec(model, ""))
        response.metadata["signature_def"].Pack(signature_map(metadata))
        return response

    async def classify(self, call: Call, request: Any) -> Any:
        model = self._model(call, request.model_spec)
        signature = check_signature(request.model_spec.signature_name)
        result = await self.classify_on(model, request.input, Origin.of(call))
        response = classification_pb2.ClassificationResponse(
            model_spec=self._spec(model, signature)
        )
        response.result.CopyFrom(result)
        return response

    async def regress(self, call: Call, request: Any) -> Any:
        model = self._model(call, request.model_spec)
        signature = check_signature(request.model_spec.signature_name)
        result = await self.regress_on(model, request.input, Origin.of(call))
        response = regression_pb2.RegressionResponse(model_spec=self._spec(model, signature))
        response.result.CopyFrom(result)
        return response

    async def multi_inference(self, call: Call, request: Any) -> Any:
        if not request.tasks:
            raise BadRequest("MultiInferenceRequest must specify at least one task")
        names = {task.model_spec.name for task in request.tasks}
        if len(names) != 1:
            raise BadRequest("All ModelSpecs in a MultiInferenceRequest must access the same model")
        response = inference_pb2.MultiInferenceResponse()
        for task in request.tasks:
            model = self._model(call, task.model_spec)
            signature = check_signature(task.model_spec.signature_name)
            result = response.results.add(model_spec=self._spec(model, signature))
            if task.method_name == CLASSIFY_METHOD:
                result.classification_result.CopyFrom(
                    await self.classify_on(model, request.input, Origin.of(call))
                )
            elif task.method_name == REGRESS_METHOD:
                result.regression_result.CopyFrom(
                    await self.regress_on(model, request.input, Origin.of(call))
                )
            else:
                raise BadRequest(f"Unsupported signature method_name: {task.method_name}")
        return response

    async def _examples(
        self, origin: Origin, model: ModelVersion, input_: Any
    ) -> tuple[list[Tensor], int]:
        examples, context = _examples(input_)
        infer = InferRequest(None, {}, examples_to_tensors(examples, context), None, True, None)
        return await self._counted(model, lambda: self._run(origin, model, infer)), len(examples)

    async def classify_on(self, model: ModelVersion, input_: Any, origin: Origin) -> Any:
        """A ``ClassificationResult`` for an ``Input`` of examples."""
        tensors, count = await self._examples(origin, model, input_)
        result = classification_pb2.ClassificationResult()
        for pairs in classifications(tensors, count):
            entry = result.classifications.add()
            for label, score in pairs:
                entry.classes.add(label=label, score=score)
        return result

    async def regress_on(self, model: ModelVersion, input_: Any, origin: Origin) -> Any:
        """A ``RegressionResult`` for an ``Input`` of examples."""
        tensors, count = await self._examples(origin, model, input_)
        result = regression_pb2.RegressionResult()
        for value in regressions(tensors, count):
            result.regressions.add(value=value)
        return result

    # ----- ModelService --------------------------------------------------------------------

    async def get_model_status(self, call: Call, request: Any) -> Any:
        spec = request.model_spec
        if not spec.name:
            raise BadRequest("Missing ModelSpec")
        choice = spec.WhichOneof("version_choice")
        if choice is None or (choice == "version" and spec.version.value == 0):
            call.label(spec.name, None)
            models = self.registry.versions(spec.name)
        else:
            models = [self._model(call, spec)]
        response = get_model_status_pb2.GetModelStatusResponse()
        for model in models:
            state, error = model_state(model)
            entry = response.model_version_status.add(version=numeric_version(model.version) or 0)
            if state == "AVAILABLE":
                entry.state = _STATES.AVAILABLE
            elif state == "LOADING":
                entry.state = _STATES.LOADING
            else:  # a version that failed or has no worker: TF Serving's END, with the reason
                entry.state = _STATES.END
            if error:
                entry.status.error_code = error_codes_pb2.UNKNOWN
                entry.status.error_message = error
        return response

    async def reload_config(self, call: Call, request: Any) -> Any:
        """Applies the version labels of a ``model_config_list`` to the models it names, which
        must be served already (models come from the model store; see
        docs/migrating-from-tf-serving.md)."""
        config = request.config
        if config.WhichOneof("config") != "model_config_list":
            raise BadRequest("ServerCore config must have a model_config_list")
        entries = list(config.model_config_list.config)
        for entry in entries:  # check all before changing any
            self.registry.versions(entry.name)
        for entry in entries:
            labels = {label: str(version) for label, version in entry.version_labels.items()}
            self.state.labels.assign(self.registry, entry.name, labels)
        return model_management_pb2.ReloadConfigResponse()


def _feature(feature: Any) -> Feature:
    kind = feature.WhichOneof("kind")
    if kind is None:
        raise BadRequest("a feature has no value list")
    return kind, list(getattr(feature, kind).value)


def _features(example: Any) -> dict[str, Feature]:
    return {name: _feature(f) for name, f in example.features.feature.items()}


def _examples(input_: Any) -> tuple[list[dict[str, Feature]], dict[str, Feature] | None]:
    """A ``tensorflow.serving.Input`` as feature dicts, and its context's when it has one."""
    kind = input_.WhichOneof("kind")
    if kind == "example_list":
        return [_features(e) for e in input_.example_list.examples], None
    if kind == "example_list_with_context":
        listed = input_.example_list_with_context
        return [_features(e) for e in listed.examples], _features(listed.context)
    raise BadRequest("Input is empty.")


def signature_map(metadata: dict[str, Any]) -> Any:
    """The model's one signature as a ``SignatureDefMap`` message."""
    signatures = get_model_metadata_pb2.SignatureDefMap()
    json_format.ParseDict(signature_def(metadata), signatures.signature_def[DEFAULT_SIGNATURE])
    return signatures
