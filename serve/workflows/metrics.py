"""Prometheus series and access-log lines for workflow requests and their nodes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

from serve.logs import ACCESS_LOGGER
from serve.workflows.executor import NodeReport

if TYPE_CHECKING:
    from serve.metrics.prometheus import ServerMetrics

access_logger = logging.getLogger(ACCESS_LOGGER)

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class WorkflowMetrics:
    """``serve_workflow_*`` families, registered in the server's metrics registry."""

    def __init__(self, metrics: ServerMetrics | None) -> None:
        self.metrics = metrics
        registry = metrics.registry if metrics is not None else None
        self.requests = Counter(
            "serve_workflow_requests",
            "Workflow inference requests by status code.",
            ["workflow", "status"],
            registry=registry,
        )
        self.seconds = Histogram(
            "serve_workflow_request_duration_seconds",
            "End-to-end workflow request latency.",
            ["workflow"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.node_seconds = Histogram(
            "serve_workflow_node_duration_seconds",
            "Time per workflow node call, retries included.",
            ["workflow", "node"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.node_calls = Counter(
            "serve_workflow_node_calls",
            "Workflow node calls by outcome (ok or failed).",
            ["workflow", "node", "outcome"],
            registry=registry,
        )
        self.node_retries = Counter(
            "serve_workflow_node_retries",
            "Workflow node attempts after the first.",
            ["workflow", "node"],
            registry=registry,
        )

    def request_done(self, workflow: str, status: int, seconds: float) -> None:
        self.requests.labels(workflow, str(status)).inc()
        self.seconds.labels(workflow).observe(seconds)

    def node_done(self, workflow: str, model_name: str, version: str, report: NodeReport) -> None:
        """One node finished (or gave up): metrics, the model's request series, an access line."""
        ok = report.status < 400
        self.node_seconds.labels(workflow, report.node).observe(report.seconds)
        self.node_calls.labels(workflow, report.node, "ok" if ok else "failed").inc()
        if report.attempts > 1:
            self.node_retries.labels(workflow, report.node).inc(report.attempts - 1)
        if self.metrics is not None:  # the node's model counts the call like any request
            self.metrics.request_done(model_name, version, report.status, report.seconds)
        if access_logger.isEnabledFor(logging.INFO):
            access_logger.info(
                "workflow=%s node=%s status=%d %.2fms attempts=%d model=%s request_id=%s",
                workflow,
                report.node,
                report.status,
                report.seconds * 1000.0,
                report.attempts,
                model_name,
                report.request_id,
            )
