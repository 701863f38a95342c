"""Function nodes of the back-translation workflow (same behaviour as TorchServe's example)."""

import json


def _payload(data):
    row = data[0] if isinstance(data, list) else data
    return json.loads(row.get("data") or row.get("body"))


def prep_intermediate_input(data, context):
    # Only the German text goes on to the German-to-English model.
    if not data:
        return None
    return [_payload(data)["german_output"]]


def post_processing(data, context):
    if not data:
        return None
    result = _payload(data)
    result["german_translation"] = result.pop("input")
    result["english_re_translation"] = result.pop("english_output")
    result.pop("batch", None)
    return [result]
