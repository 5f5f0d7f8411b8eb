"""Prometheus metrics with SGLang's names, in a registry of the app's own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
