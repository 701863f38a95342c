"""Function nodes of the dual-translation workflow (same behaviour as TorchServe's example)."""

import json


def pre_processing(data, context):
    # The DAG has a single start node: this one hands the text to both translators.
    if not data:
        return None
    first = data[0]
    return [first.get("data") or first.get("body")]


def aggregate_func(data, context):
    # A fan-in node: one parameter per parent, named after it.
    if not data:
        return None
    german = json.loads(data[0]["nmt_en_de"])
    french = json.loads(data[0]["nmt_en_fr"])
    return [
        {
            "english_input": german["input"],
            "german_translation": german["german_output"],
            "french_translation": french["french_output"],
        }
    ]
