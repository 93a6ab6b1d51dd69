"""Prometheus text exposition, by hand: counters and histograms for decisions, releases and HTTP requests."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from hetplan.allocator.spec import Allocation, Decision

DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _label_value(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, object]]) -> str:
    inner = ",".join(f'{k}="{_label_value(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.total:.9g}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    """What the service counts. Thread-safe; `render` gives the Prometheus text format (0.0.4)."""

    PREFIX = "hetplan_allocator"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.decisions: Counter[tuple[str, str]] = Counter()  # (policy, outcome)
        self.rejections: Counter[str] = Counter()  # reason
        self.shares: Counter[str] = Counter()  # share of allocations
        self.releases: Counter[str] = Counter()  # "true" found / "false" unknown job
        self.decision_seconds = Histogram(DECISION_BUCKETS)
        self.http_requests: Counter[tuple[str, str, int]] = Counter()  # (method, route, status)
        self.http_seconds = Histogram(HTTP_BUCKETS)

    def observe_decision(self, decision: Decision, seconds: float) -> None:
        with self._lock:
            if isinstance(decision, Allocation):
                self.decisions[(decision.policy, "allocated")] += 1
                self.shares[decision.share] += 1
            else:
                self.decisions[(decision.policy, "rejected")] += 1
                self.rejections[decision.reason.value] += 1
            self.decision_seconds.observe(seconds)

    def observe_release(self, found: bool) -> None:
        with self._lock:
            self.releases["true" if found else "false"] += 1

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.http_requests[(method, route, status)] += 1
            self.http_seconds.observe(seconds)

    def render(self, gauges: dict[str, tuple[str, float]], info: dict[str, str]) -> str:
        p = self.PREFIX
        lines: list[str] = []

        def head(name: str, kind: str, text: str) -> None:
            lines.append(f"# HELP {p}_{name} {text}")
            lines.append(f"# TYPE {p}_{name} {kind}")

        with self._lock:
            head("decisions_total", "counter", "Allocation decisions, by policy and outcome.")
            for (policy, outcome), n in sorted(self.decisions.items()):
                lines.append(f"{p}_decisions_total{_labels([('policy', policy), ('outcome', outcome)])} {n}")
            head("rejections_total", "counter", "Rejected allocation requests, by reason.")
            for reason, n in sorted(self.rejections.items()):
                lines.append(f"{p}_rejections_total{_labels([('reason', reason)])} {n}")
            head("allocations_total", "counter", "Allocations, by share given (hinted, reduced, proportional).")
            for share, n in sorted(self.shares.items()):
                lines.append(f"{p}_allocations_total{_labels([('share', share)])} {n}")
            head("releases_total", "counter", "Release requests, by whether the job held an allocation.")
            for found, n in sorted(self.releases.items()):
                lines.append(f"{p}_releases_total{_labels([('found', found)])} {n}")
            head("decision_seconds", "histogram", "Time to decide and durably record one allocation.")
            lines.extend(f"{p}_{line}" for line in self.decision_seconds.lines("decision_seconds"))
            head("http_requests_total", "counter", "HTTP requests, by method, route and status.")
            for (method, route, status), n in sorted(self.http_requests.items()):
                lines.append(f"{p}_http_requests_total"
                             f"{_labels([('method', method), ('route', route), ('status', status)])} {n}")
            head("http_request_seconds", "histogram", "HTTP request latency, first byte in to last byte out.")
            lines.extend(f"{p}_{line}" for line in self.http_seconds.lines("http_request_seconds"))
        for name, (text, value) in gauges.items():
            head(name, "gauge", text)
            lines.append(f"{p}_{name} {value:g}")
        head("hints_info", "gauge", "The hint version in force (1 for the version label).")
        lines.append(f"{p}_hints_info{_labels(sorted(info.items()))} 1")
        return "\n".join(lines) + "\n"
