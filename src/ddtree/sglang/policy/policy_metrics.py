"""The width policy's numbers on SGLang's /metrics (issue 70; prometheus-client, as SGLang's own collectors).

With `--enable-metrics` SGLang serves /metrics from a multiprocess registry (set up before its scheduler processes
start): what a scheduler process writes to a prometheus-client metric appears there, as SGLang's own scheduler gauges
do. TP rank 0 writes (every rank chooses alike); without --enable-metrics nothing is created.

  sglang:ddtree_step_cost_ms{batch, width}     the step cost table the policy prices widths by (set at start-up)
  sglang:ddtree_policy_steps_total{option}      decode steps that ran each option (chain, b8, ...)
  sglang:ddtree_expected_tokens{option}         the draft's expected accepted tokens + 1 per request, last read
  sglang:ddtree_draft_calibration{depth}        observed over predicted acceptance at each depth (1 = calibrated)
  sglang:ddtree_cost_correction{option, band}   measured step time over the table's, by option and batch band
                                                (band b: running batches 2^(b-1) .. 2^b - 1), as the policy prices
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddtree.sglang.policy.graph_timing import CostTable
from ddtree.sglang.policy.step_policy import StepPolicy

PUBLISH_EVERY = 32          # decode steps between two writes (each write touches the multiprocess files)


@dataclass
class PolicyMetrics:
    steps: object
    expected: object
    calibration: object
    correction: object
    published: dict[str, int] = field(default_factory=dict)     # steps counted so far, by option

    @classmethod
    def create(cls, table: CostTable, rank: int, enabled: bool) -> PolicyMetrics | None:
        """The metrics on TP rank 0 of a server with --enable-metrics (`enabled`: SGLang's observability setting),
        else None."""
        if rank != 0 or not enabled:
            return None
        from prometheus_client import Counter, Gauge        # imported here: SGLang sets its registry up first

        cost = Gauge("sglang:ddtree_step_cost_ms", "DDTREE step cost (draft + verify of a width) by running batch, "
                     "ms", ["batch", "width"], multiprocess_mode="mostrecent")
        for (batch, width), ms in table.curve().table.items():
            cost.labels(batch=str(batch), width=str(width)).set(ms)
        return cls(
            steps=Counter("sglang:ddtree_policy_steps", "DDTREE decode steps by the width the policy chose",
                          ["option"]),
            expected=Gauge("sglang:ddtree_expected_tokens", "DDTREE expected accepted tokens + 1 per request by "
                           "option, as last read", ["option"], multiprocess_mode="mostrecent"),
            calibration=Gauge("sglang:ddtree_draft_calibration", "DDTREE draft calibration: observed over predicted "
                              "acceptance by depth", ["depth"], multiprocess_mode="mostrecent"),
            correction=Gauge("sglang:ddtree_cost_correction", "DDTREE measured step time over the table's, by "
                             "option and batch band", ["option", "band"], multiprocess_mode="mostrecent"))

    def maybe_publish(self, policy: StepPolicy) -> None:
        if policy.step % PUBLISH_EVERY:
            return
        for name, count in policy.choices.counts.items():
            new = count - self.published.get(name, 0)
            if new:
                self.steps.labels(option=name).inc(new)
                self.published[name] = count
        for option, value in zip(policy.options, policy.latest):
            self.expected.labels(option=option.name).set(value)
        for depth, value in enumerate(policy.scale):
            self.calibration.labels(depth=str(depth)).set(value)
        for (band, index), ratio in sorted(policy.measured.shared.items()):
            self.correction.labels(option=policy.options[index].name, band=str(band)).set(ratio)
