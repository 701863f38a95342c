"""A torch-free test handler that holds a request until the test lets it go.

Body ``hold PATH``: create ``PATH.started``, then wait (up to 60 s) for ``PATH.release`` to exist,
then answer ``released``. Tests wait on the files, never on time. Anything else is echoed.
"""

import os
import time


def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("body", row.get("data"))
        text = body.decode(errors="replace") if isinstance(body, (bytes, bytearray)) else body
        if isinstance(text, str) and text.startswith("hold "):
            path = text.split(" ", 1)[1]
            with open(path + ".started", "w"):
                pass
            deadline = time.monotonic() + 60
            while not os.path.exists(path + ".release") and time.monotonic() < deadline:
                time.sleep(0.01)
            out.append("released")
        else:
            out.append(text)
    return out
