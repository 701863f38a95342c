"""A handler written for TorchServe's ``kserve`` (v1) envelope: it gets the ``instances``."""


def handle(data, context):
    if data is None:
        return None
    return [len(str(instance)) for instance in data]
