"""load_service: function-style and class-style handlers, output checks, handler errors."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from handler_helpers import set_batch, write

from handlers.exceptions import HandlerLoadError, InvalidHandlerOutput, PredictionException
from handlers.service import parse_handler

FUNCTION_HANDLER = """
    calls = []


    def handle(data, context):
        calls.append(data)
        if data is None:  # TorchServe's initialisation call
            return None
        return [{"n": len(row["body"]), "model": context.model_name} for row in data]
    """

NAMED_FUNCTION_HANDLER = """
    state = {}


    def setup_and_predict(data, context):
        if data is None:
            state["ready"] = context.system_properties["batch_size"]
            return None
        return [row["body"].upper() for row in data]


    def handle(data, context):
        raise AssertionError("the named function must be used, not handle()")
    """

CLASS_HANDLER = """
    from handlers.exceptions import PredictionException


    class Picky:
        def initialize(self, context):
            self.initialized = True

        def handle(self, data, context):
            if data[0]["body"] == "bad":
                raise PredictionException("bad input", 422)
            if data[0]["body"] == "short":
                return ["only one"]
            if data[0]["body"] == "dict":
                return {"not": "a list"}
            return [row["body"] for row in data]
    """


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "tiny.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's own deprecation notice
        torch.jit.script(torch.nn.Identity()).save(str(path))
    return path


def test_parse_handler():
    assert parse_handler("image_classifier") == ("image_classifier", None)
    assert parse_handler("my_handler.py") == ("my_handler", None)
    assert parse_handler("/abs/dir/my_handler.py:predict") == ("my_handler", "predict")
    assert parse_handler("dir\\h.py:fn") == ("h", "fn")


def test_module_level_handle_is_initialised_with_none(package, tmp_path, weights):
    handler = write(tmp_path / "fn_handler.py", FUNCTION_HANDLER)
    service, ctx = package(model_name="fn", handler=handler, serialized_file=weights)
    assert service.handler is None
    assert service.module.calls == [None]
    batch = [{"body": b"abc"}, {"body": b"de"}]
    set_batch(ctx, batch)
    assert service.predict(batch, ctx) == [{"n": 3, "model": "fn"}, {"n": 2, "model": "fn"}]
    assert service.module.calls[1] is batch


def test_module_function_entry_point(package, tmp_path, weights):
    handler = write(tmp_path / "named.py", NAMED_FUNCTION_HANDLER)
    service, ctx = package(
        model_name="named", handler=f"{handler}:setup_and_predict", serialized_file=weights
    )
    assert service.module.state == {"ready": 8}
    batch = [{"body": "a"}, {"body": "b"}, {"body": "c"}]
    set_batch(ctx, batch)
    assert service.predict(batch, ctx) == ["A", "B", "C"]


def test_missing_named_function_is_an_error(package, tmp_path, weights):
    handler = write(tmp_path / "named.py", NAMED_FUNCTION_HANDLER)
    with pytest.raises(HandlerLoadError, match="no function 'nope'"):
        package(model_name="nofn", handler=f"{handler}:nope", serialized_file=weights)


def test_class_handler_errors_and_output_checks(package, tmp_path, weights):
    handler = write(tmp_path / "picky.py", CLASS_HANDLER)
    service, ctx = package(model_name="picky", handler=handler, serialized_file=weights)
    assert service.handler.initialized

    ok = [{"body": "x"}, {"body": "y"}]
    set_batch(ctx, ok)
    assert service.predict(ok, ctx) == ["x", "y"]

    bad = [{"body": "bad"}]
    set_batch(ctx, bad)
    with pytest.raises(PredictionException) as info:
        service.predict(bad, ctx)
    assert info.value.error_code == 422 and info.value.message == "bad input"
    assert str(info.value) == "bad input : 422"

    short = [{"body": "short"}, {"body": "second"}]
    set_batch(ctx, short)
    with pytest.raises(InvalidHandlerOutput, match="returned 1 results for a batch of 2"):
        service.predict(short, ctx)

    not_a_list = [{"body": "dict"}]
    set_batch(ctx, not_a_list)
    with pytest.raises(InvalidHandlerOutput, match="returned dict"):
        service.predict(not_a_list, ctx)


def test_handler_override_and_builtin_resolution(package, tmp_path, weights):
    handler = write(tmp_path / "fn_handler.py", FUNCTION_HANDLER)
    # The archive names a custom handler; the override picks the built-in base_handler.
    service, ctx = package(
        model_name="override",
        handler=handler,
        serialized_file=weights,
        handler_override="base_handler",
    )
    assert type(service.handler).__module__ == "handlers.base_handler"
    batch = [{"body": [1.0, 2.0]}, {"body": [3.0, 4.0]}]
    set_batch(ctx, batch)
    assert service.predict(batch, ctx) == [[1.0, 2.0], [3.0, 4.0]]


def test_module_with_two_classes_is_rejected(package, tmp_path, weights):
    handler = write(tmp_path / "two.py", "class A:\n    pass\n\n\nclass B:\n    pass\n")
    with pytest.raises(HandlerLoadError, match=r"only one class.*\['A', 'B'\]"):
        package(model_name="two", handler=handler, serialized_file=weights)


def test_unknown_handler_name(package, weights):
    with pytest.raises(HandlerLoadError, match="not found"):
        package(
            model_name="unknown",
            handler="base_handler",
            serialized_file=weights,
            handler_override="no_such_handler_anywhere",
        )


def test_handler_file_named_like_a_library_does_not_replace_it(
    package, tmp_path, weights, monkeypatch
):
    import json

    import handlers

    # Loading puts each model directory on sys.path, as a worker does; here the test process is
    # the "worker", so the path is restored afterwards: a later test's subprocess (the big-JSON
    # offload pool) would otherwise import this json.py instead of the standard library's.
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("json", "handlers"):
        handler = write(tmp_path / f"{name}.py", FUNCTION_HANDLER)
        service, ctx = package(model_name=f"lib_{name}", handler=handler, serialized_file=weights)
        assert service.module.__name__ == f"_lantern_user_{name}"
        batch = [{"body": b"x"}]
        set_batch(ctx, batch)
        assert service.predict(batch, ctx) == [{"n": 1, "model": f"lib_{name}"}]
    assert sys.modules["json"] is json and sys.modules["handlers"] is handlers
