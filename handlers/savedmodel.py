"""TensorFlow SavedModels in a worker (the ``lantern-serve[tensorflow]`` extra).

`load_savedmodel` loads a SavedModel folder with ``tf.saved_model.load`` and keeps its serving
signature (``serving_default``, else its only one). `SavedModelAdapter` puts it behind the worker's
tensor path like ONNX and torch models: inputs and outputs (names, datatypes, shapes) come from
the signature, named inputs go in, the signature's named outputs come back. TensorFlow is
imported here only, in the worker that serves a SavedModel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from handlers.exceptions import TensorError
from handlers.tensor_models import Feeds, ModelAdapter, Outputs, TensorSpec

DEFAULT_SIGNATURE = "serving_default"

# tf.DType.name -> OIP datatype
_DATATYPES = {
    "float32": "FP32",
    "float64": "FP64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "bool": "BOOL",
    "string": "BYTES",
}


class SavedModel:
    """A loaded SavedModel and the signature it serves."""

    def __init__(self, loaded: Any, signature: str) -> None:
        self.loaded = loaded
        self.signature_name = signature
        self.function = loaded.signatures[signature]

    def eval(self) -> SavedModel:
        return self

    def to(self, *args: Any, **kwargs: Any) -> SavedModel:
        return self


def load_savedmodel(path: str, num_threads: int | None) -> SavedModel:
    import tensorflow as tf

    if num_threads:
        try:  # only before TensorFlow's first op
            tf.config.threading.set_intra_op_parallelism_threads(int(num_threads))
        except RuntimeError:
            pass
    loaded = tf.saved_model.load(path)
    names = list(loaded.signatures.keys())
    if not names:
        raise TensorError(f"{path}: the SavedModel has no signatures to serve")
    signature = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in names else names[0]
    return SavedModel(loaded, signature)


def _spec(name: str, spec: Any) -> TensorSpec:
    shape = [-1 if d is None else int(d) for d in spec.shape] if spec.shape.rank is not None else []
    return TensorSpec(name, _DATATYPES.get(spec.dtype.name, ""), shape)


class SavedModelAdapter(ModelAdapter):
    """A SavedModel signature called with named tensors."""

    platform = "tensorflow_savedmodel"

    def __init__(self, model: SavedModel) -> None:
        self.model = model
        function = model.function
        _, kwargs = function.structured_input_signature
        inputs = [_spec(name, spec) for name, spec in sorted(kwargs.items())]
        outputs = [_spec(name, spec) for name, spec in sorted(function.structured_outputs.items())]
        super().__init__(inputs, outputs)
        self._dtypes = {name: spec.dtype for name, spec in kwargs.items()}

    def run(self, feeds: Feeds) -> Outputs:
        import tensorflow as tf

        args = {}
        for spec in self.inputs:
            array, _ = feeds[spec.name]
            args[spec.name] = tf.constant(array, dtype=self._dtypes[spec.name])
        result = self.model.function(**args)
        outputs: Outputs = []
        for name in sorted(result):
            array = result[name].numpy()
            datatype = _DATATYPES.get(result[name].dtype.name)
            if datatype is None:
                raise TensorError(f"output '{name}' has dtype {result[name].dtype.name}")
            if datatype == "BYTES":
                array = np.asarray(array, dtype=object)
            outputs.append((name, array, datatype))
        return outputs
