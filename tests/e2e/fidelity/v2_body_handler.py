"""A module-level TorchServe handler that reads the v2 request from the body itself (no envelope).

TorchServe gives it the KServe v2 JSON (HTTP ``/v2/.../infer``, or a gRPC ``ModelInfer`` turned
into that JSON); it answers a v2 response object: each input negated, plus what it was given.
"""

import json


def handle(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        body = row.get("body") or row.get("data")
        if isinstance(body, (bytes, bytearray)):
            body = json.loads(body)
        outputs = [
            {
                "name": f"neg_{tensor['name']}",
                "shape": tensor["shape"],
                "datatype": "FP32",
                "data": [-float(v) for v in tensor["data"]],
            }
            for tensor in body["inputs"]
        ]
        seen = {"id": body.get("id"), "model_name": body.get("model_name"), "keys": sorted(body)}
        outputs.append(
            {"name": "seen", "shape": [1], "datatype": "BYTES", "data": [json.dumps(seen)]}
        )
        answers.append(
            {"id": body.get("id"), "model_name": body.get("model_name"), "outputs": outputs}
        )
    return answers
