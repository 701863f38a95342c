"""Loading a model's handler and calling it per batch (TorchServe's ``model_loader`` + ``service``).

Handler string ``module[:function]`` (``.py`` and directories stripped). The module is looked up
in the model directory first, then among Lantern's built-in handlers, then as an importable
module, then as ``ts.torch_handler.<module>``. If the module has the function (default
``handle``) it is used function-style: called once as ``fn(None, context)`` to initialise, then
``fn(batch, context)`` per batch. Otherwise the module must define exactly one class, which is
instantiated, then ``initialize(context)`` and ``handle(batch, context)`` are called on it.

``initialize`` may be a coroutine (TorchServe's ``asyncCommunication`` handlers, e.g. its
``VLLMHandler``, build their async engine in it): it is run to completion on an event loop of
its own, kept in `Service.loop`, so that an ``asyncCommunication`` worker serves ``handle`` on
the loop the engine was made on (`serve.worker.concurrent.AsyncLoop`).

Deviation from TorchServe: an explicit ``module:function`` whose function does not exist is an
error, instead of a silent fall-back to class style.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from handlers.context import Context
from handlers.exceptions import HandlerLoadError, InvalidHandlerOutput
from handlers.modules import ensure_on_sys_path, import_file, list_classes_from_module

BUILTIN_HANDLERS = frozenset(
    {
        "base_handler",
        "image_classifier",
        "image_segmenter",
        "object_detector",
        "text_classifier",
        "text_generation",
        "triton_python",
    }
)
DEFAULT_FUNCTION = "handle"


def parse_handler(spec: str) -> tuple[str, str | None]:
    """``"dir/my_handler.py:fn"`` -> ``("my_handler", "fn")``; no function -> None."""
    module_part, sep, function = spec.strip().partition(":")
    module_name = module_part.replace("\\", "/").rsplit("/", 1)[-1]
    if module_name.endswith(".py"):
        module_name = module_name[: -len(".py")]
    if not module_name:
        raise HandlerLoadError(f"invalid handler {spec!r}")
    return module_name, (function or None) if sep else None


def _import_missing(exc: ModuleNotFoundError, module_name: str) -> bool:
    """True when ``exc`` says ``module_name`` itself is missing (not something it imports)."""
    missing = exc.name or ""
    return missing == module_name or module_name.startswith(missing + ".")


def import_handler_module(module_name: str, model_dir: str | os.PathLike) -> ModuleType:
    """Find the handler module: model dir, built-ins, importable module, ``ts.torch_handler``."""
    local = os.path.join(os.fspath(model_dir), module_name + ".py")
    if os.path.isfile(local):
        return import_file(local, module_name)
    if module_name in BUILTIN_HANDLERS:
        return importlib.import_module(f"handlers.{module_name}")
    for candidate in (module_name, f"ts.torch_handler.{module_name}"):
        try:
            return importlib.import_module(candidate)
        except ModuleNotFoundError as exc:
            if not _import_missing(exc, candidate):
                raise
    raise HandlerLoadError(
        f"handler module {module_name!r} not found in the model directory, among the built-in "
        f"handlers ({', '.join(sorted(BUILTIN_HANDLERS))}) or on the Python path"
    )


@dataclass
class Service:
    """A loaded handler: ``predict`` runs one batch through it."""

    model_name: str
    model_dir: str
    manifest: dict
    context: Context
    entry_point: Callable[[Any, Context], Any]
    module: ModuleType
    handler: Any = None  # the handler instance (class style) or None (function style)
    function_name: str | None = field(default=None)
    envelope: str | None = None  # the service_envelope wrapping entry_point, if any
    # The event loop an ``async def initialize`` ran on; None when initialisation was sync.
    loop: asyncio.AbstractEventLoop | None = None

    def predict(self, batch: list, ctx: Context | None = None) -> list:
        """Call the handler on ``batch``; the result must be a list with one item per request."""
        ctx = ctx if ctx is not None else self.context
        ctx.handler_timings = {}
        result = self.entry_point(batch, ctx)
        if not isinstance(result, list):
            raise InvalidHandlerOutput(
                f"Invalid model predict output: the handler returned {type(result).__name__}, "
                f"expected a list with one result per request ({len(batch)})"
            )
        if len(result) != len(batch):
            raise InvalidHandlerOutput(
                f"number of batch response mismatched: the handler returned {len(result)} "
                f"results for a batch of {len(batch)}"
            )
        return result


def load_service(
    model_dir: str | os.PathLike, manifest: dict, context: Context, handler: str | None = None
) -> Service:
    """Import and initialise the model's handler (``handler`` overrides the manifest's)."""
    model_dir = os.fspath(model_dir)
    model_info = (manifest or {}).get("model") or {}
    spec = handler or model_info.get("handler")
    if not spec:
        raise HandlerLoadError("no handler: the manifest has no model.handler and none was given")
    if context.manifest is None:
        context.manifest = manifest
    module_name, function_name = parse_handler(spec)
    ensure_on_sys_path(model_dir)
    module = import_handler_module(module_name, model_dir)

    fn_name = function_name or DEFAULT_FUNCTION
    entry_point = getattr(module, fn_name, None)
    instance = None
    initialized: Any = None
    if callable(entry_point):
        initialized = entry_point(None, context)  # TorchServe's initialisation call
    elif function_name is not None:
        raise HandlerLoadError(f"handler module {module_name!r} has no function {function_name!r}")
    else:
        classes = list_classes_from_module(module)
        if len(classes) != 1:
            names = [c.__name__ for c in classes]
            raise HandlerLoadError(
                f"Expected only one class in custom service code or a function entry point "
                f"in {module_name!r}, found {names}"
            )
        instance = classes[0]()
        if not callable(getattr(instance, "handle", None)):
            raise HandlerLoadError(f"Expect handle method in class {classes[0].__name__}")
        initialize = getattr(instance, "initialize", None)
        if callable(initialize):
            initialized = initialize(context)
        entry_point = instance.handle
    loop = _await_initialize(initialized) if inspect.isawaitable(initialized) else None

    return Service(
        model_name=context.model_name or model_info.get("modelName", ""),
        model_dir=model_dir,
        manifest=manifest,
        context=context,
        entry_point=entry_point,
        module=module,
        handler=instance,
        function_name=fn_name if instance is None else None,
        loop=loop,
    )


def _await_initialize(initialized: Any) -> asyncio.AbstractEventLoop:
    """Run an ``async def initialize`` to its end on a new event loop, kept open for ``handle``."""

    async def wait() -> Any:
        return await initialized

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(wait())
    except BaseException:
        loop.close()
        raise
    return loop
