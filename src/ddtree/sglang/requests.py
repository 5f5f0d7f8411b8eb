"""Per-request features a DDTREE server refuses with a clear error (no SGLang import).

The DDTREE decode step verifies a tree of candidate continuations at once; request features
whose meaning depends on the exact path through that tree are not implemented in it, and
SGLang's DFLASH code for them assumes a chain. Rather than approximate them silently, the
plugin's hook on SGLang's TokenizerManager._validate_one_request rejects such a request
before it reaches the scheduler: the client gets an error naming the field, its value and the
fix, and the server keeps serving everyone else. Logit bias (the same for every tree node) and
stop conditions (applied to the emitted tokens) are supported. A per-request sampling seed at
temperature > 0 is served under SGLang's deterministic inference (each tree node drawn as SGLang's
seeded sampler draws, ddtree.sglang.seeded) and refused without it (SGLang itself uses seeds only
there; DDTREE would sample from the server's generator).
"""

from __future__ import annotations

from collections.abc import Mapping

FIX = "send the request without it, or to a server with --speculative-algorithm DFLASH or NONE"

# sampling_params fields and their neutral values
NEUTRAL_SAMPLING = {
    "frequency_penalty": 0.0,      # depends on the tokens generated inside the tree path
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,           # masks EOS by position along the path
}
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


def request_refusal(sampling_params: Mapping | None, request: object, deterministic: bool = False,
                    penalties: bool = False, logprobs: bool = False, grammars: bool = False,
                    processors: bool = False, overlap: bool = False) -> str | None:
    """The first unsupported feature of one generate request, as an error message, or None.

    sampling_params: the request's sampling parameters as sent (a dict or None); request: an
    object with the request-level fields of SGLang's GenerateReqInput (read with getattr);
    deterministic: the server runs --enable-deterministic-inference (seeds are honoured);
    penalties: the server was started with SGLANG_DDTREE_PENALTIES=1 (per-node penalties, under test);
    logprobs: the server was started with SGLANG_DDTREE_LOGPROBS=1 (output logprobs, under test);
    grammars: the server was started with SGLANG_DDTREE_GRAMMARS=1 (constrained trees, under test);
    processors: the server was started with SGLANG_DDTREE_PROCESSORS=1 (custom logit processors per node);
    overlap: the server runs the overlap scheduler (SGLANG_DDTREE_OVERLAP=1), under which penalties are refused
    whatever their switch (the worker feeds SGLang's penalizers itself; untested with the overlap's own feeding).
    """
    if getattr(request, "return_logprob", False) and not logprobs:
        return f"return_logprob=True is not supported by this DDTREE server (per-node logprobs of the tree); {FIX}"
    for field in () if logprobs else ("top_logprobs_num", "token_ids_logprob"):
        if getattr(request, field, None):
            return f"{field}={getattr(request, field)!r} is not supported by this DDTREE server; {FIX}"
    if getattr(request, "return_hidden_states", False):
        return f"return_hidden_states=True is not supported by this DDTREE server; {FIX}"
    if getattr(request, "return_sampling_mask", False):
        return f"return_sampling_mask=True is not supported by this DDTREE server; {FIX}"
    if getattr(request, "custom_logit_processor", None) and not processors:
        return f"custom_logit_processor is not supported by this DDTREE server; {FIX}"
    params = sampling_params or {}
    if params.get("sampling_seed") is not None and float(params.get("temperature", 1.0)) > 0 and not deterministic:
        return (f"sampling_params.sampling_seed={params['sampling_seed']!r} is not supported by this DDTREE server at "
                "temperature > 0: it runs without --enable-deterministic-inference, the only mode in which SGLang "
                "uses a seed (start the server with that flag to have seeded answers reproduced), or "
                f"{FIX}")
    for field in () if grammars else GRAMMAR_FIELDS:
        if params.get(field) is not None:
            return f"sampling_params.{field} (constrained decoding) is not supported by this DDTREE server; {FIX}"
    for field, neutral in ({} if penalties and not overlap else NEUTRAL_SAMPLING).items():
        value = params.get(field)
        if value is not None and float(value) != float(neutral):
            return (f"sampling_params.{field}={value!r} is not supported by this DDTREE server (only {neutral} "
                    f"is); {FIX}")
    return None
