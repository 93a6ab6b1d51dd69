"""The service's Prometheus metrics, through `prometheus-client`: counters and histograms for decisions, releases
and HTTP requests, and gauges of the cluster state read at scrape time.

Every `Metrics` has its own `CollectorRegistry` (none of the library's global one), so two applications in one
process (test servers, a benchmark) never count into each other. Names, types and labels (the contract that
dashboards and docs rely on), prefix `hetplan_allocator_`:

- `decisions_total{policy,outcome}`, `rejections_total{reason}`, `allocations_total{share}`,
  `releases_total{found}`, `http_requests_total{method,route,status}`: counters;
- `decision_seconds`, `http_request_seconds`: histograms;
- `nodes`, `allocations`, `gpus`, `free_gpus`, `free_cpus`, `free_mem_gb` (GiB), `hints_info{version}`: gauges;
- with the Kubernetes node sync (`hetplan serve --kubeconfig`): `kube_node_changes_total{change}` (upsert,
  remove, close) and `kube_sync_errors_total`, counters; `kube_synced_nodes` (the allocator's nodes the sync
  owns) and `kube_skipped_nodes{reason}` (the cluster's Nodes it does not place on now), gauges.

The library also writes a `<counter>_created` gauge per counter and histogram (when the series started).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hetplan.allocator.spec import Allocation, Decision

PREFIX = "hetplan_allocator"
DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what `generate_latest` writes

Gauges = dict[str, tuple[str, float]]
"""Gauge name (without the prefix) -> (help text, value)."""
State = Callable[[], tuple[Gauges, dict[str, str]]]
"""Read at each scrape: the gauges, and the labels of `hints_info`."""


class _StateCollector(Collector):
    def __init__(self, state: State) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        gauges, info = self.state()
        for name, (text, value) in gauges.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=value)
        hints = GaugeMetricFamily(f"{PREFIX}_hints_info", "The hint version in force (1 for the version label).",
                                  labels=sorted(info))
        hints.add_metric([info[k] for k in sorted(info)], 1)
        yield hints


class Metrics:
    """What the service counts, in a registry of its own. Thread-safe (the library's metrics are)."""

    def __init__(self) -> None:
        # the state collector names its gauges only when scraped (their values come from the allocator then)
        self.registry = CollectorRegistry(support_collectors_without_names=True)
        r = self.registry
        self.decisions = Counter(f"{PREFIX}_decisions", "Allocation decisions, by policy and outcome.",
                                 ["policy", "outcome"], registry=r)
        self.rejections = Counter(f"{PREFIX}_rejections", "Rejected allocation requests, by reason.", ["reason"],
                                  registry=r)
        self.shares = Counter(f"{PREFIX}_allocations",
                              "Allocations, by share given (hinted, reduced, proportional).", ["share"], registry=r)
        self.releases = Counter(f"{PREFIX}_releases", "Release requests, by whether the job held an allocation.",
                                ["found"], registry=r)
        self.decision_seconds = Histogram(f"{PREFIX}_decision_seconds",
                                          "Time to decide and durably record one allocation.",
                                          buckets=DECISION_BUCKETS, registry=r)
        self.http_requests = Counter(f"{PREFIX}_http_requests", "HTTP requests, by method, route and status.",
                                     ["method", "route", "status"], registry=r)
        self.http_seconds = Histogram(f"{PREFIX}_http_request_seconds",
                                      "HTTP request latency, first byte in to last byte out.",
                                      buckets=HTTP_BUCKETS, registry=r)
        self.kube_changes = Counter(f"{PREFIX}_kube_node_changes", "Node changes the Kubernetes node sync applied, "
                                    "by change (upsert, remove, close).", ["change"], registry=r)
        self.kube_errors = Counter(f"{PREFIX}_kube_sync_errors", "Kubernetes node sync errors (each retried).",
                                   registry=r)
        self.kube_synced = Gauge(f"{PREFIX}_kube_synced_nodes", "Allocator nodes the Kubernetes node sync owns.",
                                 registry=r)
        self.kube_skipped = Gauge(f"{PREFIX}_kube_skipped_nodes", "Kubernetes Nodes not placed on now, by reason.",
                                  ["reason"], registry=r)

    def watch(self, state: State) -> None:
        """Expose the gauges `state` returns at every scrape (the cluster's nodes, GPUs, ..., the hint version)."""
        self.registry.register(_StateCollector(state))

    def observe_decision(self, decision: Decision, seconds: float) -> None:
        if isinstance(decision, Allocation):
            self.decisions.labels(decision.policy, "allocated").inc()
            self.shares.labels(decision.share).inc()
        else:
            self.decisions.labels(decision.policy, "rejected").inc()
            self.rejections.labels(decision.reason.value).inc()
        self.decision_seconds.observe(seconds)

    def observe_queued(self, seconds: float) -> None:
        """A submission that waits in the queue (`decisions{outcome="queued"}`)."""
        self.decisions.labels("scheduler", "queued").inc()
        self.decision_seconds.observe(seconds)

    def observe_release(self, found: bool) -> None:
        self.releases.labels("true" if found else "false").inc()

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_seconds.observe(seconds)

    def render(self) -> str:
        """The Prometheus text format (0.0.4, `CONTENT_TYPE`)."""
        return generate_latest(self.registry).decode()
