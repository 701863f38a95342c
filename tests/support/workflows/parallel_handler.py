"""Function nodes around two slow branches; ``start`` refuses the input ``boom``."""

import json


def start(data, context):
    if data is None:
        return None
    texts = [(row.get("data") or row.get("body")).decode() for row in data]
    if "boom" in texts:
        raise ValueError("start node refuses 'boom'")
    return texts


def join(data, context):
    if data is None:
        return None
    return [
        {"a": json.loads(row["slow_a"]), "b": json.loads(row["slow_b"]), "order": list(row)}
        for row in data
    ]
