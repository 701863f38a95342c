"""``ts.torch_handler``: TorchServe's default handlers, backed by Lantern's."""
