"""A TorchServe-style streaming handler: three intermediate chunks, then the final answer."""

import time

from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    for i in range(3):
        chunk = [f"part{i} " for _ in data]
        send_intermediate_predict_response(chunk, context.request_ids, "Intermediate", 200, context)
        time.sleep(0.3)
    return ["done" for _ in data]
