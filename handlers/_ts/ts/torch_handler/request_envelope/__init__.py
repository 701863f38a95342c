"""``ts.torch_handler.request_envelope``."""
