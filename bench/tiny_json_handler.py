"""The tiny model's handler for protocol comparisons: JSON rows whether or not they were decoded.

Over HTTP with ``Content-Type: application/json`` the worker has already decoded the body; over
gRPC (TorchServe's ``Predictions``) inputs carry no content type and arrive as bytes, as in
TorchServe, so this handler decodes them. Otherwise it is the built-in ``base_handler``.
"""

import json

import torch
from ts.torch_handler.base_handler import BaseHandler


class TinyJsonHandler(BaseHandler):
    def preprocess(self, data):
        rows = []
        for row in data:
            value = row.get("data", row.get("body"))
            if isinstance(value, (bytes, bytearray)):
                value = json.loads(value)
            rows.append(value)
        return torch.as_tensor(rows, device=self.device)
