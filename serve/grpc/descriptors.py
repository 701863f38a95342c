"""The descriptor pool server reflection answers from (``grpcurl list``/``describe``).

It holds TorchServe's three files, TF Serving's services (and the TensorFlow files they import),
health, reflection, and ``grpc_predict_v2.proto``: the Open
Inference Protocol under KServe's package ``inference``, made from TorchServe's
``open_inference_grpc.proto`` (the messages are the same field for field). That copy lives only in
this private pool, never in protobuf's default one, so a client process can still import
``tritonclient.grpc``, whose own ``inference`` package would clash with it.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, empty_pb2
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from serve.grpc import ort_codec
from serve.grpc.gen import inference_pb2, management_pb2, open_inference_grpc_pb2
from serve.grpc.gen.tensorflow_serving.apis import model_service_pb2, prediction_service_pb2

TORCHSERVE_OIP = "org.pytorch.serve.grpc.openinference"
KSERVE_OIP = "inference"


def _file(module: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _retarget(messages: Any, old: str, new: str) -> None:
    for message in messages:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
        _retarget(message.nested_type, old, new)


def kserve_file() -> descriptor_pb2.FileDescriptorProto:
    """TorchServe's OIP file renamed into KServe's package, references and all."""
    proto = _file(open_inference_grpc_pb2)
    proto.name = "grpc_predict_v2.proto"
    proto.package = KSERVE_OIP
    old, new = f".{TORCHSERVE_OIP}.", f".{KSERVE_OIP}."
    _retarget(proto.message_type, old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new, 1)
            method.output_type = method.output_type.replace(old, new, 1)
    return proto


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    result = descriptor_pool.DescriptorPool()
    for module in (
        any_pb2,
        empty_pb2,
        status_pb2,
        inference_pb2,
        management_pb2,
        open_inference_grpc_pb2,
        health_pb2,
        reflection_pb2,
    ):
        result.Add(_file(module))
    result.Add(kserve_file())
    for module in (prediction_service_pb2, model_service_pb2):  # TF Serving's, with their imports
        _add_with_imports(result, module.DESCRIPTOR)
    for proto in ort_codec.file_set().file:  # ONNX Runtime Server's, imports first
        result.Add(proto)
    return result


def _add_with_imports(pool: descriptor_pool.DescriptorPool, file: Any) -> None:
    """``file`` and every file it imports that ``pool`` lacks, imports first."""
    for dependency in file.dependencies:
        _add_with_imports(pool, dependency)
    try:
        pool.FindFileByName(file.name)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)
