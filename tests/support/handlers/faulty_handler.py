"""A test handler whose failures carry paths and tracebacks that clients must not see.

Body ``script``: a TorchScript function raises (its message holds a TorchScript traceback with
this file's path). Body ``path``: raises FileNotFoundError naming an absolute path. Body
``spam N``: prints N lines of 1 KiB to stdout. Anything else is echoed.
"""

import torch


@torch.jit.script
def _scripted_check(x: torch.Tensor) -> torch.Tensor:
    if bool(x.sum() > 0):
        raise RuntimeError("input rejected by the scripted check")
    return x


def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("body", row.get("data"))
        text = body.decode(errors="replace") if isinstance(body, (bytes, bytearray)) else body
        if text == "script":
            _scripted_check(torch.ones(2))
        if text == "path":
            raise FileNotFoundError("/srv/build/secret-project/weights.bin is missing")
        if isinstance(text, str) and text.startswith("spam "):
            line = "x" * 1023
            for _ in range(int(text.split()[1])):
                print(line)
        out.append(text if isinstance(text, str) else repr(text))
    return out
