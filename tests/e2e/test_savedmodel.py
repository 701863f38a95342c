"""A TensorFlow SavedModel built in code, served from a TF Serving tree, answers as TensorFlow does.

TensorFlow runs in a subprocess here (it builds the SavedModel and computes the expected
answers) and in the server's worker, never in the test process: the test process imports the TF
Serving stubs, whose TensorFlow file names would clash with TensorFlow's own in protobuf's pool.
Needs the ``tensorflow`` extra (``tensorflow-cpu``, in the dev extra).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import grpc
import httpx
import numpy as np
import pytest

from tests.support.grpc_stubs import generate_tf_serving
from tests.support.server import LanternServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="needs lantern-serve[tensorflow]"
)

BUILD = """
import sys
import numpy as np
import tensorflow as tf

out = sys.argv[1]

class Affine(tf.Module):
    def __init__(self):
        self.w = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2) / 10)
        self.b = tf.Variable(np.array([0.5, -0.5], dtype=np.float32))

    @tf.function(input_signature=[
        tf.TensorSpec([None, 4], tf.float32, name="x"),
        tf.TensorSpec([None], tf.int64, name="k"),
    ])
    def serve(self, x, k):
        y = tf.matmul(x, self.w) + self.b
        return {"y": y, "scaled": tf.cast(k, tf.float32)[:, None] * y}

model = Affine()
tf.saved_model.save(model, out + "/models/affine/1", signatures={"serving_default": model.serve})
x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
k = np.array([1, 2, 3], dtype=np.int64)
loaded = tf.saved_model.load(out + "/models/affine/1").signatures["serving_default"]
answer = loaded(x=tf.constant(x), k=tf.constant(k))
np.savez(out + "/expected.npz", x=x, k=k, y=answer["y"].numpy(), scaled=answer["scaled"].numpy())
"""


class SavedModelServer(LanternServer):
    expected: dict[str, np.ndarray]
    stubs: SimpleNamespace


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SavedModelServer]:
    work = tmp_path_factory.mktemp("savedmodel")
    subprocess.run([sys.executable, "-c", BUILD, str(work)], check=True, timeout=300)
    tree = work / "models" / "affine"
    srv = SavedModelServer(
        work, tree.parent, [], args=["--model_name", "affine", "--model_base_path", str(tree)]
    )
    srv.start()
    with np.load(work / "expected.npz") as data:
        srv.expected = {key: data[key] for key in data.files}
    srv.stubs = generate_tf_serving(work / "stubs")

    def ready() -> bool:
        resp = httpx.get(f"{srv.inference}/v1/models/affine", timeout=10)
        return resp.status_code == 200 and resp.json()["ready"]

    wait_for(ready, 120, "the SavedModel served")
    yield srv
    srv.stop()


def test_grpc_predict_equals_tensorflow(server: SavedModelServer) -> None:
    stubs, want = server.stubs, server.expected
    request = stubs.predict_pb2.PredictRequest()
    request.model_spec.name = "affine"
    x = request.inputs["x"]
    x.dtype = stubs.types_pb2.DT_FLOAT
    for size in want["x"].shape:
        x.tensor_shape.dim.add(size=size)
    x.tensor_content = want["x"].tobytes()
    k = request.inputs["k"]
    k.dtype = stubs.types_pb2.DT_INT64
    k.tensor_shape.dim.add(size=3)
    k.int64_val.extend(want["k"].tolist())
    with grpc.insecure_channel(server.grpc_inference) as channel:
        stub = stubs.prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer = stub.Predict(request, timeout=60)
        meta_request = stubs.get_model_metadata_pb2.GetModelMetadataRequest(
            metadata_field=["signature_def"]
        )
        meta_request.model_spec.name = "affine"
        meta = stub.GetModelMetadata(meta_request, timeout=60)
    for name in ("y", "scaled"):
        got = np.asarray(answer.outputs[name].float_val, dtype=np.float32).reshape(3, 2)
        np.testing.assert_array_equal(got, want[name])
    signatures = stubs.get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(signatures)
    sig = signatures.signature_def["serving_default"]
    assert sig.inputs["x"].dtype == stubs.types_pb2.DT_FLOAT
    assert sig.inputs["k"].dtype == stubs.types_pb2.DT_INT64
    assert [d.size for d in sig.inputs["x"].tensor_shape.dim] == [-1, 4]
    assert set(sig.outputs) == {"y", "scaled"}


def test_rest_predict_equals_tensorflow(server: SavedModelServer) -> None:
    want = server.expected
    instances = [{"x": x.tolist(), "k": int(k)} for x, k in zip(want["x"], want["k"], strict=True)]
    resp = httpx.post(
        f"{server.inference}/v1/models/affine:predict", json={"instances": instances}, timeout=60
    )
    assert resp.status_code == 200, resp.text
    predictions = resp.json()["predictions"]
    np.testing.assert_allclose([p["y"] for p in predictions], want["y"], rtol=1e-6)
    np.testing.assert_allclose([p["scaled"] for p in predictions], want["scaled"], rtol=1e-6)
