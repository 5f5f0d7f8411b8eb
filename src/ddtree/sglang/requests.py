"""Per-request features a DDTREE server refuses with a clear error (no SGLang import).

The DDTREE decode step verifies a tree of candidate continuations at once; request features
whose meaning depends on the exact path through that tree are not implemented in it, and
SGLang's DFLASH code for them assumes a chain. Rather than approximate them silently, the
plugin's hook on SGLang's TokenizerManager._validate_one_request rejects such a request
before it reaches the scheduler: the client gets an error naming the field, its value and the
fix, and the server keeps serving everyone else. Logit bias (the same for every tree node) and
stop conditions (applied to the emitted tokens) are supported. A per-request sampling seed at
temperature > 0 is served under SGLang's deterministic inference (each tree node drawn as SGLang's
seeded sampler draws, ddtree.sglang.step.seeded) and refused without it (SGLang itself uses seeds only
there; DDTREE would sample from the server's generator). Grammars and custom logit processors are served on every
DDTREE server, and so are penalties, min_new_tokens and output logprobs (their switches were removed once the H200 test
bed showed each equal to NONE on pairs where that is decidable: grammars and processors 2026-12-03, penalties and
logprobs 2026-12-04; docs/benchmarks.md). Under the overlap scheduler penalties, min_new_tokens and custom logit
processors stay refused: each reads the request's answer so far on the host, and SGLang 0.5.23's overlap loop
(Scheduler.event_loop_overlap) runs a step (run_batch, where DDTREE verifies and samples) before it appends the
previous step's tokens to the request (process_batch_result). Grammars are not affected: SGLang synchronises a
grammar batch of an algorithm that does not advance the grammar itself (ScheduleBatch.grammar_needs_sync, DDTREE's
case), and delays NONE's grammar sampling past the append (TpModelWorker's delay_sample_func). A processor or a
penalty gets no such wait: every tree node would see the answer without the previous step's accepted tokens (up to
budget + 1 of them; SGLang's own NONE under the overlap scheduler is itself one token late there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

FIX = "send the request without it, or to a server with --speculative-algorithm DFLASH or NONE"

# sampling_params fields and their neutral values
NEUTRAL_SAMPLING = {
    "frequency_penalty": 0.0,      # depends on the tokens generated inside the tree path
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,           # masks EOS by position along the path
}


@dataclass(frozen=True)
class ServedFeatures:
    """What one DDTREE server serves beyond plain sampling, fixed at its start.

    deterministic: --enable-deterministic-inference (seeds at temperature > 0 are honoured);
    overlap: the server runs the overlap scheduler, under which penalties, min_new_tokens and custom logit processors
    stay refused (they read the request's answer, which the overlap loop updates a step late: the module's docstring).
    """

    deterministic: bool = False
    overlap: bool = False

    @classmethod
    def from_server(cls, server_args: object) -> ServedFeatures:
        """From SGLang's ServerArgs (getattr)."""
        return cls(deterministic=bool(getattr(server_args, "enable_deterministic_inference", False)),
                   overlap=not bool(getattr(server_args, "disable_overlap_schedule", True)))


PLAIN = ServedFeatures()


def request_refusal(sampling_params: Mapping | None, request: object, served: ServedFeatures = PLAIN) -> str | None:
    """The first unsupported feature of one generate request, as an error message, or None.

    sampling_params: the request's sampling parameters as sent (a dict or None); request: an
    object with the request-level fields of SGLang's GenerateReqInput (read with getattr);
    served: what this server serves (ServedFeatures.from_server).
    """
    params = sampling_params or {}
    return (_request_field_refusal(request, served) or _seed_refusal(params, served)
            or _penalty_refusal(params, served) or _processor_refusal(request, served))


def _request_field_refusal(request: object, served: ServedFeatures) -> str | None:
    if getattr(request, "return_hidden_states", False):
        return f"return_hidden_states=True is not supported by this DDTREE server; {FIX}"
    if getattr(request, "return_sampling_mask", False):
        return f"return_sampling_mask=True is not supported by this DDTREE server; {FIX}"
    return None


def _seed_refusal(params: Mapping, served: ServedFeatures) -> str | None:
    if params.get("sampling_seed") is None or float(params.get("temperature", 1.0)) <= 0 or served.deterministic:
        return None
    return (f"sampling_params.sampling_seed={params['sampling_seed']!r} is not supported by this DDTREE server at "
            "temperature > 0: it runs without --enable-deterministic-inference, the only mode in which SGLang "
            "uses a seed (start the server with that flag to have seeded answers reproduced), or "
            f"{FIX}")


def _penalty_refusal(params: Mapping, served: ServedFeatures) -> str | None:
    if not served.overlap:
        return None
    for field, neutral in NEUTRAL_SAMPLING.items():
        value = params.get(field)
        if value is not None and float(value) != float(neutral):
            return (f"sampling_params.{field}={value!r} is not supported by this DDTREE server under the overlap "
                    f"scheduler (only {neutral} is); {FIX}, or to a DDTREE server started with "
                    "--disable-overlap-schedule")
    return None


def _processor_refusal(request: object, served: ServedFeatures) -> str | None:
    """A custom logit processor under the overlap scheduler (the module's docstring says why). SGLang normalises
    the field to one entry per prompt, None where a prompt has none."""
    if not served.overlap:
        return None
    processor = getattr(request, "custom_logit_processor", None)
    entries = processor if isinstance(processor, list) else [processor]
    if not any(entry for entry in entries):
        return None
    return ("custom_logit_processor is not supported by this DDTREE server under the overlap scheduler (a processor "
            "reads the answer so far, which SGLang brings up to date only after the next speculative step has run, "
            f"so every tree node would see it a step late); {FIX}, or to a DDTREE server started with "
            "--disable-overlap-schedule")
