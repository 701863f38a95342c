"""Registered workflows: register (models through the registry), describe, list, run, unregister.

As in TorchServe 0.12, each DAG node becomes a model named ``<workflow>__<node>``: a model node is
registered from its spec ``url`` (model store and ``allowed_urls`` rules) with the spec's workers
and batching; a function node is registered from the workflow's own folder with the handler
``<handler file>:<node>``, so it runs in a worker process, never in the frontend. If any node
fails to register, the ones that did are removed again and the workflow is not registered.

The archive is opened, and its spec parsed and checked, on a thread: a hostile spec costs the
event loop nothing (`serve.workflows.spec` bounds it). A refused archive's full reason, with the
store's paths, goes to the log; the client gets it without server paths.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archiver import ArchiveError, ManifestError
from archiver.manifest import validate_model_name
from archiver.workflow import WorkflowArchive, open_workflow
from serve.core.describe import describe_model
from serve.core.jobs import BatchItem, ItemResult
from serve.core.model import ModelSource
from serve.store.sources import ModelLocation, ModelSources
from serve.wire.errors import (
    BadRequest,
    Conflict,
    ModelNotFound,
    NotFound,
    ServeError,
    response_too_large,
)
from serve.wire.redact import client_message
from serve.workflows.dag import Dag, Param, build_dag, compose_answer
from serve.workflows.executor import NodeReport, run_dag
from serve.workflows.metrics import WorkflowMetrics
from serve.workflows.spec import NodeSettings, SpecLimits, WorkflowSpec, parse_spec

if TYPE_CHECKING:
    from serve.config import Config
    from serve.core.registry import Registry
    from serve.metrics.prometheus import ServerMetrics

logger = logging.getLogger(__name__)

FUNCTION_VERSION = "1.0"  # TorchServe's version for function nodes


class WorkflowNotFound(NotFound):
    error_type = "WorkflowNotFoundException"


class InvalidWorkflow(BadRequest):
    error_type = "InvalidWorkflowException"


class WorkflowRegistrationFailed(ServeError):
    error_type = "WorkflowException"


@dataclass
class Workflow:
    """One registered workflow and the models its nodes run on."""

    name: str
    url: str
    archive: WorkflowArchive
    spec: WorkflowSpec
    dag: Dag
    models: dict[str, str]  # node -> registered model name
    location: ModelLocation
    cleanup_dir: Path | None
    settings: dict[str, NodeSettings] = field(default_factory=dict)


class Workflows:
    """The workflows by name; models go through `Registry` like every other model."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        work_dir: Path,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        store = config.workflow_store or config.model_store
        self.sources = ModelSources(
            config.replace(model_store=store), suffixes=(".war",), kind="workflow archive"
        )
        self.extract_dir = work_dir / "workflows"
        self.extract_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.workflows: dict[str, Workflow] = {}
        self._pending: set[str] = set()
        self.metrics = WorkflowMetrics(metrics)
        self.limits = SpecLimits(config.workflow_max_nodes, config.workflow_max_edges)

    # ----- lookups ---------------------------------------------------------------------

    def get(self, name: str) -> Workflow:
        workflow = self.workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(f"Workflow not found: {name}")
        return workflow

    def page(self, limit: int, offset: int) -> dict[str, Any]:
        """TorchServe's list: names sorted, ``nextPageToken`` while more follow."""
        names = sorted(self.workflows)
        body: dict[str, Any] = {}
        if offset + limit < len(names):
            body["nextPageToken"] = str(offset + limit)
        body["workflows"] = [
            {"workflowName": n, "workflowUrl": self.workflows[n].url}
            for n in names[offset : offset + limit]
        ]
        return body

    def describe(self, name: str) -> dict[str, Any]:
        """TorchServe's describe fields, then the DAG and each node's model with its workers."""
        wf = self.get(name)
        d = wf.spec.defaults
        nodes = []
        for node in wf.dag.order:
            s = wf.settings[node]
            entry: dict[str, Any] = {
                "name": node,
                "type": "model" if wf.spec.is_model(node) else "function",
                "modelName": wf.models[node],
                "retryAttempts": s.retry_attempts,
                "timeoutMs": s.timeout_ms,
            }
            try:
                entry["model"] = describe_model(self.registry.get(wf.models[node]))
            except ModelNotFound:
                entry["model"] = None  # unregistered on its own through /models
            nodes.append(entry)
        return {
            "workflowName": wf.name,
            "workflowUrl": wf.url,
            "minWorkers": d.min_workers,
            "maxWorkers": d.max_workers,
            "batchSize": d.batch_size,
            "maxBatchDelay": d.max_batch_delay,
            "workflowDag": wf.spec.dag_text,
            "dag": {node: list(wf.dag.children[node]) for node in wf.dag.order},
            "startNode": wf.dag.start,
            "leafNodes": list(wf.dag.leaves),
            "nodes": nodes,
        }

    # ----- changes ---------------------------------------------------------------------

    async def register(self, url: str, workflow_name: str | None = None) -> Workflow:
        """Open the .war, check its spec and DAG, register every node's model (all or none)."""
        if not url:
            raise BadRequest("Parameter url is required.")
        try:
            location = await self.sources.resolve(url)
        except ModelNotFound:
            raise WorkflowNotFound(f"Workflow not found in workflow store: {url}") from None
        dest = self.extract_dir / uuid.uuid4().hex
        try:
            archive = await asyncio.to_thread(open_workflow, location.path, dest)
        except (ArchiveError, OSError) as exc:
            shutil.rmtree(dest, ignore_errors=True)
            self._forget(location)
            logger.warning("Refused workflow archive %s: %s", url, exc)
            raise InvalidWorkflow(
                f"Invalid workflow archive {url}: {client_message(str(exc))}"
            ) from exc
        cleanup = dest if archive.workflow_dir.is_relative_to(dest.resolve()) else None
        try:
            name = workflow_name or archive.workflow_name
            workflow = await asyncio.to_thread(self._plan, name, url, archive, location, cleanup)
            if name in self.workflows or name in self._pending:
                raise Conflict(f"Workflow {name} is already registered.")
        except ServeError:
            _remove_dir(cleanup)
            self._forget(location)
            raise
        self._pending.add(name)
        try:
            await self._register_nodes(workflow)
        except ServeError:
            _remove_dir(cleanup)
            self._forget(location)
            raise
        finally:
            self._pending.discard(name)
        self.workflows[name] = workflow
        logger.info("Registered workflow %s from %s", name, url)
        return workflow

    def _plan(
        self,
        name: str,
        url: str,
        archive: WorkflowArchive,
        location: ModelLocation,
        cleanup: Path | None,
    ) -> Workflow:
        try:
            validate_model_name(name)
        except ManifestError:
            raise BadRequest(
                f"Invalid workflow name {name!r}: use letters, digits, '_', '-' and '.', "
                "starting with a letter or digit."
            ) from None
        try:
            text = archive.spec_file.read_bytes()
        except OSError as exc:
            raise InvalidWorkflow(
                f"Cannot read the workflow spec {archive.spec_file.name}: {exc.strerror}"
            ) from None
        spec = parse_spec(text, self.limits)
        dag = build_dag(spec.edges)
        functions = [n for n in dag.order if not spec.is_model(n)]
        if functions and not archive.handler:
            raise InvalidWorkflow(
                f"Nodes {', '.join(functions)} are not models in the spec, and the workflow "
                "archive has no handler file to find them in."
            )
        return Workflow(
            name=name,
            url=url,
            archive=archive,
            spec=spec,
            dag=dag,
            models={node: f"{name}__{node}" for node in dag.order},
            location=location,
            cleanup_dir=cleanup,
            settings={node: spec.settings(node) for node in dag.order},
        )

    async def _register_nodes(self, wf: Workflow) -> None:
        nodes = list(wf.dag.order)
        results = await asyncio.gather(
            *(self._register_node(wf, node) for node in nodes), return_exceptions=True
        )
        failures = []
        done = []
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, BaseException):
                detail = result.message if isinstance(result, ServeError) else repr(result)
                failures.append(
                    f"Workflow Node {wf.models[node]} failed to register. Details: {detail}"
                )
                if not isinstance(result, ServeError):
                    logger.error("Workflow node %s failed to register", node, exc_info=result)
            else:
                done.append(wf.models[node])
        if not failures:
            return
        await self._unregister_models(done)
        raise WorkflowRegistrationFailed(
            f"Workflow {wf.name} has failed to register. Failures: [{', '.join(failures)}]"
        )

    async def _register_node(self, wf: Workflow, node: str) -> None:
        s = wf.settings[node]
        settings = {
            "batch_size": s.batch_size,
            "max_batch_delay": s.max_batch_delay,
            "max_workers": s.max_workers,
        }
        # TorchServe starts max-workers workers for each node model.
        workers = max(s.min_workers, s.max_workers)
        model_name = wf.models[node]
        if wf.spec.is_model(node):
            await self.registry.register(
                wf.spec.models[node][0],
                model_name=model_name,
                initial_workers=workers,
                synchronous=True,
                settings=settings,
                workflow=wf.name,
            )
            return
        assert wf.archive.handler is not None
        handler = f"{wf.archive.handler}:{node}"
        manifest = {
            "createdOn": wf.archive.manifest.get("createdOn"),
            "runtime": "python",
            "model": {
                "modelName": model_name,
                "modelVersion": FUNCTION_VERSION,
                "handler": handler,
            },
            "archiverVersion": wf.archive.manifest.get("archiverVersion"),
        }
        source = ModelSource(
            url=wf.url,
            model_dir=wf.archive.workflow_dir,
            manifest=manifest,
            model_config={},
            handler=None,
            workflow=wf.name,
        )
        await self.registry.add_source(
            model_name,
            FUNCTION_VERSION,
            source,
            initial_workers=workers,
            synchronous=True,
            settings=settings,
            store_name=wf.url,
        )

    def function_nodes(self) -> set[str]:
        """The registered model names of every workflow's function nodes (not model nodes)."""
        return {
            model
            for wf in self.workflows.values()
            for node, model in wf.models.items()
            if not wf.spec.is_model(node)
        }

    async def unregister(self, name: str) -> Workflow:
        """Remove the workflow, then its node models (their queued requests finish first)."""
        wf = self.workflows.pop(self.get(name).name)
        await self._unregister_models(list(wf.models.values()))
        _remove_dir(wf.cleanup_dir)
        self._forget(wf.location)
        logger.info("Unregistered workflow %s", name)
        return wf

    async def _unregister_models(self, names: list[str]) -> None:
        async def one(model: str) -> None:
            try:
                await self.registry.unregister(model)
            except ModelNotFound:
                pass  # already removed through /models

        await asyncio.gather(*(one(m) for m in names))

    def close(self) -> None:
        for wf in self.workflows.values():
            _remove_dir(wf.cleanup_dir)

    def _forget(self, location: ModelLocation) -> None:
        """A .war this server downloaded goes when its workflow does (TorchServe's rule)."""
        if location.downloaded:
            location.path.unlink(missing_ok=True)

    # ----- inference -------------------------------------------------------------------

    async def predict(
        self, name: str, params: list[Param], headers: dict[str, str], request_id: str
    ) -> bytes:
        """Run one request through the workflow's DAG; returns the answer's body.

        Every node's output, and the answer, is held to ``max_response_size``; an answer of
        several leaves is composed on a thread (it parses and writes each leaf's JSON)."""
        wf = self.get(name)
        limit = self.config.max_response_size
        started = time.perf_counter()
        status = 500
        try:
            leaves = await run_dag(
                wf.dag,
                wf.settings,
                params,
                headers,
                request_id,
                lambda node, item, timeout: self._invoke(wf, node, item, timeout),
                lambda report: self._node_done(wf, report),
                max_output=limit,
            )
            try:
                if len(leaves) == 1:
                    body = compose_answer(leaves)
                else:
                    body = await asyncio.to_thread(compose_answer, leaves)
            except ValueError as exc:
                raise ServeError(f"{exc} (request id {request_id})") from None
            if len(body) > limit:
                raise ServeError(f"{response_too_large(limit).message} (request id {request_id})")
            status = 200
            return body
        except ServeError as exc:
            status = exc.status_code
            raise
        finally:
            self.metrics.request_done(wf.name, status, time.perf_counter() - started)

    def _invoke(self, wf: Workflow, node: str, item: BatchItem, timeout: float) -> Any:
        model = self.registry.get(wf.models[node])
        future: asyncio.Future[ItemResult] = model.submit(item, timeout)
        return future

    def _node_done(self, wf: Workflow, report: NodeReport) -> None:
        model_name = wf.models[report.node]
        try:
            version = self.registry.get(model_name).version
        except ModelNotFound:
            version = "default"
        self.metrics.node_done(wf.name, model_name, version, report)


def _remove_dir(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
