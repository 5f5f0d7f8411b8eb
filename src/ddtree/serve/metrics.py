"""Prometheus metrics with SGLang's names, in a registry of the app's own (no global state)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# SGLang 0.5.23's default bucket bounds (seconds), so that the alerts' percentiles interpolate alike
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.labels = {"model_name": model_name}

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=self.registry).labels(**self.labels)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=self.registry).labels(**self.labels)

        self.spec_accept_length = gauge("sglang:spec_accept_length",
                                        "Tokens per verify step (accepted draft tokens + 1), last step's mean")
        self.spec_accept_rate = gauge("sglang:spec_accept_rate", "Accepted draft tokens / drafted depth, last step")
        self.spec_verify_calls = counter("sglang:spec_verify_calls", "Target verify passes after prefill")
        self.num_requests = counter("sglang:num_requests", "Finished requests")
        self.prompt_tokens = counter("sglang:prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = counter("sglang:generation_tokens", "Generated tokens")
        self.num_running = gauge("sglang:num_running_reqs", "Requests in the running batch")
        self.num_queue = gauge("sglang:num_queue_reqs", "Requests waiting for a batch")
        self.num_rejected = counter("ddtree:queue_full_rejections",
                                    "Requests answered 503 because --max-queued-requests were waiting")
        self.is_cuda_graph = gauge("sglang:is_cuda_graph", "1 when decoding replays CUDA graphs")
        self.e2e_latency = Histogram("sglang:e2e_request_latency_seconds", "Request latency", labels,
                                     registry=self.registry).labels(**self.labels)
        # SGLang's latency histograms (issue 49: the TTFT and inter-token alerts read them), with its buckets' span
        self.time_to_first_token = Histogram("sglang:time_to_first_token_seconds", "Time to first token", labels,
                                             buckets=TTFT_BUCKETS, registry=self.registry).labels(**self.labels)
        self.inter_token_latency = Histogram("sglang:inter_token_latency_seconds", "Time between two tokens", labels,
                                             buckets=ITL_BUCKETS, registry=self.registry).labels(**self.labels)
        # SGLang's answers by route, status and method (its http_request_metrics; the error-budget alerts read it)
        self.http_responses = Counter("sglang:http_responses", "HTTP responses by endpoint and status code",
                                      ["endpoint", "status_code", "method"], registry=self.registry)

    def record_tokens(self, timing: TokenTiming, now: float, count: int) -> None:
        """A request's `count` new tokens at `now`: the first one's wait since admission, then one gap per
        token (a verify step that accepts k tokens spreads its interval over the k, as SGLang does)."""
        if count <= 0:
            return
        if timing.last is None:
            self.time_to_first_token.observe(now - timing.started)
            count -= 1
        elif count:
            gap = (now - timing.last) / count
            for _ in range(count):
                self.inter_token_latency.observe(gap)
        timing.last = now


@dataclass
class TokenTiming:
    """One request's clock: admitted at `started`, its last tokens at `last` (None before the first)."""

    started: float
    last: float | None = None
