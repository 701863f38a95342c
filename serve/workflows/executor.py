"""Running one workflow request over its DAG: nodes start as soon as all their parents are done.

No user code runs here: each node is called through ``invoke`` (a model version's ``submit``),
and only bytes move between nodes. Each attempt of a node has its own ``timeout-ms``; a failed
or timed-out attempt is retried ``retry-attempts`` times; then the request fails with the node
named (500), and the node calls still running are cancelled. A node's output larger than
``max_output`` (the server's ``max_response_size``) ends the request at once, not retried, with
the error ``/predictions`` gives for such an output.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from serve.core.jobs import BatchItem, ItemResult
from serve.wire.errors import GatewayTimeout, NotFound, ServeError, response_too_large
from serve.workflows.dag import Dag, Param, node_params
from serve.workflows.spec import NodeSettings

logger = logging.getLogger(__name__)

# (node, item, timeout in seconds) -> the node's answer; raises ServeError on failure.
Invoke = Callable[[str, BatchItem, float], Awaitable[ItemResult]]


class NodeFailed(ServeError):
    """A workflow node failed on every attempt; the message names it."""

    error_type = "InternalServerException"


class _OutputTooLarge(Exception):
    """Inside `_call`: the node answered more than ``max_output`` bytes."""


@dataclass(frozen=True)
class NodeReport:
    """One finished node call, for metrics and the access log."""

    node: str
    status: int
    seconds: float
    attempts: int
    request_id: str


async def run_dag(
    dag: Dag,
    settings: Mapping[str, NodeSettings],
    request: Sequence[Param],
    headers: dict[str, str],
    request_id: str,
    invoke: Invoke,
    report: Callable[[NodeReport], None] = lambda _: None,
    max_output: int | None = None,
) -> list[tuple[str, bytes]]:
    """Run the DAG for one request; returns ``(leaf, output)`` in the order leaves finished."""
    inputs: dict[str, list[tuple[str, bytes]]] = {node: [] for node in dag.order}
    waiting = {node: len(dag.parents[node]) for node in dag.order}
    running: dict[asyncio.Task[bytes], str] = {}
    leaves: list[tuple[str, bytes]] = []

    def start(node: str) -> None:
        params = node_params(dag, node, request, inputs[node])
        call = _call(node, settings[node], params, headers, request_id, invoke, report, max_output)
        running[asyncio.ensure_future(call)] = node

    start(dag.start)
    try:
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                node = running.pop(task)
                output = task.result()  # NodeFailed ends the request
                if not dag.children[node]:
                    leaves.append((node, output))
                for child in dag.children[node]:
                    inputs[child].append((node, output))
                    waiting[child] -= 1
                    if waiting[child] == 0:
                        start(child)
    finally:
        for task in running:
            task.cancel()
    return leaves


async def _call(
    node: str,
    settings: NodeSettings,
    params: list[Param],
    headers: dict[str, str],
    request_id: str,
    invoke: Invoke,
    report: Callable[[NodeReport], None],
    max_output: int | None = None,
) -> bytes:
    node_request_id = f"{request_id}:{node}"
    timeout = settings.timeout_ms / 1000.0
    attempts = settings.retry_attempts + 1
    started = time.perf_counter()
    reason = ""
    status = 500
    for attempt in range(1, attempts + 1):
        item = BatchItem(node_request_id, dict(headers), list(params))
        try:
            result = await asyncio.wait_for(invoke(node, item, timeout), timeout)
            body = await _whole_body(result, max_output)
            if result.status < 400:
                seconds = time.perf_counter() - started
                report(NodeReport(node, result.status, seconds, attempt, request_id))
                return body
            status = result.status
            reason = f"status {result.status}: {body[:200].decode(errors='replace')}"
        except _OutputTooLarge:
            assert max_output is not None
            report(NodeReport(node, 500, time.perf_counter() - started, attempt, request_id))
            err = response_too_large(max_output)
            logger.error("Workflow request %s: node %s: %s", request_id, node, err.message)
            raise ServeError(f"{err.message} (node {node}, request id {request_id})") from None
        except asyncio.TimeoutError:
            status, reason = 504, f"no answer within timeout-ms ({settings.timeout_ms} ms)"
        except GatewayTimeout:  # the deadline passed while the call waited in the node's queue
            status, reason = 504, f"no answer within timeout-ms ({settings.timeout_ms} ms)"
        except ServeError as exc:
            status, reason = exc.status_code, exc.message
            if isinstance(exc, NotFound):  # its model is gone: retrying cannot help
                attempts = attempt
                break
        logger.error(
            "Workflow request %s: node %s failed (attempt %d of %d): %s",
            request_id,
            node,
            attempt,
            attempts,
            reason,
        )
    report(NodeReport(node, status, time.perf_counter() - started, attempts, request_id))
    message = f"Error executing {node}: failed after {attempts} attempt(s), last: {reason}"
    if request_id not in message:  # a handler error already names the node's request id
        message += f" (request id {request_id})"
    raise NodeFailed(message)


async def _whole_body(result: ItemResult, limit: int | None = None) -> bytes:
    """A streamed answer (send_intermediate_predict_response) is joined into one body; past
    ``limit`` bytes it raises `_OutputTooLarge` (a stream: as soon as the chunks pass it)."""
    size = len(result.body)
    if limit is not None and size > limit:
        raise _OutputTooLarge
    if result.stream is None:
        return result.body
    parts = [result.body]
    while (chunk := await result.stream.get()) is not None:
        if isinstance(chunk, ServeError):
            raise chunk
        size += len(chunk.body)
        if limit is not None and size > limit:
            raise _OutputTooLarge
        parts.append(chunk.body)
    return b"".join(parts)
