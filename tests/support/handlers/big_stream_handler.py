"""A TorchServe-style streaming handler of big answers: ``PARTS`` parts of ``PART_BYTES`` each
(20 MiB in all), as fast as the frontend takes them; it prints ``streamed <request id>`` to the
model log once it has sent the last."""

from ts.handler_utils.utils import send_intermediate_predict_response

PART_BYTES = 256 * 1024
PARTS = 80


def handle(data, context):
    if data is None:
        return None
    part = b"x" * PART_BYTES
    for _ in range(PARTS - 1):
        send_intermediate_predict_response(
            [part for _ in data], context.request_ids, "Intermediate", 200, context
        )
    for rid in context.request_ids.values():
        print(f"streamed {rid}", flush=True)
    return [part for _ in data]
