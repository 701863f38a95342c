from serve.grpc.gen.tensorflow_serving.apis import model_pb2 as _model_pb2
from serve.grpc.gen.tensorflow_serving.config import logging_config_pb2 as _logging_config_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LogMetadata(_message.Message):
    __slots__ = ("model_spec", "sampling_config", "saved_model_tags", "timestamp_secs", "dc", "request_origin", "request_criticality", "safe_aggregation_privacy_key")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_CONFIG_FIELD_NUMBER: _ClassVar[int]
    SAVED_MODEL_TAGS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_SECS_FIELD_NUMBER: _ClassVar[int]
    DC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ORIGIN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CRITICALITY_FIELD_NUMBER: _ClassVar[int]
    SAFE_AGGREGATION_PRIVACY_KEY_FIELD_NUMBER: _ClassVar[int]
    model_spec: _model_pb2.ModelSpec
    sampling_config: _logging_config_pb2.SamplingConfig
    saved_model_tags: _containers.RepeatedScalarFieldContainer[str]
    timestamp_secs: int
    dc: str
    request_origin: str
    request_criticality: str
    safe_aggregation_privacy_key: int
    def __init__(self, model_spec: _Optional[_Union[_model_pb2.ModelSpec, _Mapping]] = ..., sampling_config: _Optional[_Union[_logging_config_pb2.SamplingConfig, _Mapping]] = ..., saved_model_tags: _Optional[_Iterable[str]] = ..., timestamp_secs: _Optional[int] = ..., dc: _Optional[str] = ..., request_origin: _Optional[str] = ..., request_criticality: _Optional[str] = ..., safe_aggregation_privacy_key: _Optional[int] = ...) -> None: ...
