"""The dog-breed workflow's start node: the image, base64-encoded for both models."""

import base64


def pre_processing(data, context):
    if data is None:
        return data
    return [base64.b64encode(row.get("data") or row.get("body")).decode() for row in data]
