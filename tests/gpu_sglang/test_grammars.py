"""Constrained decoding on DDTREE inside the real SGLang 0.5.23 server (issue 33, item 4; marker sglang_gpu).

Servers (testbed/servers.py, suffix -grammar: the server tokenizes, so SGLang builds its xgrammar backend;
JSON white space at most 2 in a row; DDTREE's constrained trees served): NONE, DFLASH and DDTREE b32 c8 with
CUDA graphs. What is checked, each able to fail:
- 80 requests (20 JSON schema, 20 regex, 20 EBNF, 20 structural tag) at temperature 0, one at a time and 8 at once, on
  DDTREE without and with the overlap scheduler: every DDTREE
  answer is a complete sentence of its grammar (replayed through SGLang's own xgrammar matcher with the pair's
  tokenizer: every token accepted, the matcher terminated), and equal to NONE's constrained answer or parted
  from it only at a near tie of NONE's own constrained top-2 (its logprobs come after the grammar's mask);
- the accept length under each grammar beside the unconstrained one on the same prompts, and DFLASH's under
  the same grammars (issue 33, item 7);
- through the official openai client: response_format with a JSON schema (the content parses and validates),
  and a forced tool call (tool_choice naming the function: the call is that function with valid arguments),
  each equal to NONE's answer.
"""

from __future__ import annotations

import json
import statistics

import pytest

from tests.gpu_sglang.test_ddtree_server import mean_accept, outputs, ready
from tests.gpu_sglang.test_requests import judge_processed

from testbed import servers as harness
pytestmark = pytest.mark.sglang_gpu

NONE, DFLASH, DDTREE = "none-grammar", "dflash-grammar", "ddtree-b32-c8-graphs-grammar"
# DDTREE under the overlap scheduler: SGLang runs its grammar batches synchronously (DDTREE does not advance the
# grammar inside verify), so its constrained answers must be NONE's too (-k overlap selects these)
DDTREE_OVERLAP = "ddtree-b32-c8-graphs-grammar-overlap"
TREES = {"plain": DDTREE, "overlap": DDTREE_OVERLAP}
GRAMMAR_SERVERS = (NONE, DFLASH, DDTREE, DDTREE_OVERLAP)
MAX_NEW = 160
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                           "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
GRAMMARS = {
    "json_schema": json.dumps(PERSON),
    "regex": r"(yes|no|maybe), [0-9]{1,3}( [a-z]{2,8}){2,5}\.",
    "ebnf": ('root ::= "(" term (op term)? (op term)? (op term)? ")"\nop ::= " + " | " * "\n'
             'term ::= [1-9] [0-9]? [0-9]?'),
    # SGLang's (legacy) structural tag: free text, then <call>...</call> tags whose body is a JSON object of
    # the schema, at least one (the answer opens with one); free text after it has no end but EOS
    "structural_tag": json.dumps({"structures": [{"begin": "<call>", "schema": PERSON, "end": "</call>"}],
                                  "triggers": ["<call"], "at_least_one": True}),
}
OPEN_ENDED = {"structural_tag"}       # a sentence may stop at max_new_tokens: its matcher is not terminated then
# strict: SGLang 0.5.23's Kimi K2 detector constrains a non-strict tool's arguments only to "some JSON object"
# (kimik2_detector.get_structural_tag), which a byte-level model fills until max_tokens: on the H200 on 2026-12-04
# NONE and DDTREE alike stopped at the length limit inside the call, with no tool call parsed
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def constrained(kind: str) -> dict:
    return {"temperature": 0.0, "max_new_tokens": MAX_NEW, kind: GRAMMARS[kind]}


@pytest.fixture(scope="module")
def matcher_backend(pair):
    """SGLang's own xgrammar backend over the pair's tokenizer, to replay answers through a fresh matcher."""
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from transformers import AutoTokenizer

    config = json.loads((pair / "target" / "config.json").read_text())
    text = config.get("text_config", config)
    eos = text.get("eos_token_id")
    return XGrammarGrammarBackend(AutoTokenizer.from_pretrained(pair / "target"), vocab_size=int(text["vocab_size"]),
                                  model_eos_token_ids=eos if isinstance(eos, list) else [eos])


def in_language(backend, kind: str, tokens: list[int]) -> bool:
    """Every token accepted by a fresh matcher of the grammar, which ends terminated (an open-ended grammar's
    answer may instead stop at max_new_tokens)."""
    method = {"json_schema": "dispatch_json", "regex": "dispatch_regex", "ebnf": "dispatch_ebnf",
              "structural_tag": "dispatch_structural_tag"}[kind]
    g = getattr(backend, method)(GRAMMARS[kind])
    try:
        for t in tokens:
            g.accept_token(int(t))
    except ValueError:
        return False
    return g.is_terminated() or (kind in OPEN_ENDED and len(tokens) == MAX_NEW)


def params(kind: str | None) -> dict:
    return constrained(kind) if kind else {"temperature": 0.0, "max_new_tokens": MAX_NEW}


def grammar_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """20 prompts per grammar: the 16 held-out prompts and 4 of them cut shorter."""
    return prompts + [p[: max(2, len(p) // 3)] for p in prompts[:4]]


@pytest.mark.parametrize("scheduler", sorted(TREES))
@pytest.mark.parametrize("kind", sorted(GRAMMARS))
def test_constrained_answers_are_sentences_and_nones(fleet, kind, scheduler, prompts, matcher_backend,
                                                     record_property):
    plain, tree = ready(fleet, NONE), ready(fleet, TREES[scheduler])
    group = grammar_prompts(prompts)
    want = outputs(plain.complete_all(group, constrained(kind), 1))
    assert all(in_language(matcher_backend, kind, w) for w in want), "NONE's own answers are not sentences"
    parted, wrong, same = [], [], 0
    for mode, concurrency in (("one by one", 1), ("8 at once", 8)):
        got = outputs(tree.complete_all(group, constrained(kind), concurrency))
        wrong += [(mode, i, "not a sentence of the grammar") for i, g in enumerate(got)
                  if not in_language(matcher_backend, kind, g)]
        judged = judge_processed(plain, group, constrained(kind), want, got)     # NONE's logprobs come after the mask
        same += judged.identical
        parted += judged.ties
        wrong += [(mode, *difference) for difference in judged.wrong]
    record_property("requests", 2 * len(group))
    record_property("sentences of the grammar", f"{2 * len(group) - len([w for w in wrong if 'sentence' in w[2]])}"
                                                f"/{2 * len(group)}")
    record_property("identical to NONE", f"{same}/{2 * len(group)}")
    record_property("parted at a near tie", parted)
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("scheduler", sorted(TREES))
def test_a_batch_mixing_grammars_and_free_requests(fleet, prompts, scheduler, matcher_backend, record_property):
    """16 requests 8 at a time, each grammar and none in turn: the constrained rows of a step are rebuilt on
    the host while the free rows keep the device's tree - each answer NONE's (parted only at a near tie), the
    constrained ones sentences of their grammars."""
    plain, tree = ready(fleet, NONE), ready(fleet, TREES[scheduler])
    kinds = [*sorted(GRAMMARS), None]
    asks = [(p, kinds[i % len(kinds)]) for i, p in enumerate(prompts)]

    def run(server, concurrency):
        with harness.ThreadPoolExecutor(max_workers=concurrency) as pool:
            return outputs(list(pool.map(lambda a: server.generate(a[0], params(a[1])), asks)))

    want, got = run(plain, 1), run(tree, 8)
    assert all(in_language(matcher_backend, k, out) for (_, k), out in zip(asks, got) if k)
    checks = [judge_processed(plain, [p], params(k), [w], [g]) for (p, k), w, g in zip(asks, want, got)]
    record_property("identical to NONE", f"{sum(c.identical for c in checks)}/{len(asks)}")
    record_property("parted at a near tie", [gap for c in checks for gap in c.ties])
    wrong = [difference for c in checks for difference in c.wrong]
    assert not wrong, wrong[:5]


def test_accept_length_with_a_grammar_beside_without(fleet, prompts, record_property):
    tree, chain = ready(fleet, DDTREE), ready(fleet, DFLASH)
    group = grammar_prompts(prompts)
    free = mean_accept(tree.complete_all(group, {"temperature": 0.0, "max_new_tokens": MAX_NEW}, 8))
    record_property("DDTREE unconstrained accept length", round(free, 3))
    for kind in sorted(GRAMMARS):
        got = tree.complete_all(group, constrained(kind), 8)
        record_property(f"DDTREE {kind} accept length", round(mean_accept(got), 3))
        record_property(f"DFLASH {kind} accept length", round(mean_accept(chain.complete_all(group, constrained(kind), 8)),
                                                              3))
        record_property(f"{kind} answer length", round(statistics.fmean(len(a) for a in outputs(got)), 1))
    assert free > 1.0


def openai_client(server: harness.Server):
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=300)
    return client, client.models.list().data[0].id


def test_openai_client_response_format_json_schema(fleet, record_property):
    import jsonschema

    answers = {}
    for name in (NONE, DDTREE):
        client, model = openai_client(ready(fleet, name))
        reply = client.chat.completions.create(
            model=model, temperature=0, max_tokens=MAX_NEW,
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        answers[name] = reply.choices[0].message.content
        jsonschema.validate(json.loads(answers[name]), PERSON)
    record_property("DDTREE content", answers[DDTREE][:200])
    assert answers[DDTREE] == answers[NONE]


# Kimi K2's call framing alone is about 150 byte tokens (<|tool_calls_section_begin|><|tool_call_begin|>functions...):
# at MAX_NEW both servers stopped at the length limit inside the call (H200, 2026-12-03)
TOOL_MAX_NEW = 480


FORCED_TOOL_CALL = {"temperature": 0, "max_tokens": TOOL_MAX_NEW, "tools": [WEATHER], "logprobs": True,
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                    "parallel_tool_calls": False,
                    "messages": [{"role": "user", "content": "What is the weather in Oslo?"}]}


def test_openai_client_forced_tool_call(fleet, record_property):
    """tool_choice naming the function, the servers running Kimi K2's tool-call parser (as production does; SGLang
    0.5.23 returns no tool_calls without a parser - the H200 run of 2026-12-03). DDTREE's reply - finish reason,
    content, tool calls and the raw tokens (log-probs on) - must equal NONE's; where NONE's reply holds the call,
    DDTREE's call is checked against the tool's schema too. On the byte-level pairs NONE itself returned no call at
    480 tokens with the strict tool (H200 2026-12-04: finish "length", no content, no call, on both pairs): SGLang's
    constraint for Kimi K2's forced call lets the call's index be any number of digits (`\\d+`,
    tests/sglang/test_gpu_requests.py), and a byte-level model can write digits until the length limit. There
    this is an equality test; each reply and its raw text are recorded first, so a failure names the server."""
    import jsonschema

    replies = {}
    for name in (NONE, DDTREE):
        client, model = openai_client(ready(fleet, name))
        reply = client.chat.completions.create(model=model, **FORCED_TOOL_CALL)
        choice = reply.choices[0]
        raw = "".join(t.token for t in (choice.logprobs.content or [])) if choice.logprobs else ""
        replies[name] = {"finish": choice.finish_reason, "content": choice.message.content or "", "raw": raw,
                         "tool_calls": [(c.function.name, c.function.arguments)
                                        for c in choice.message.tool_calls or []]}
        record_property(f"{name} reply", str({k: v[:200] if isinstance(v, str) else v
                                              for k, v in replies[name].items()})[:600])
    assert replies[DDTREE] == replies[NONE]
    calls = replies[NONE]["tool_calls"]
    record_property("NONE returned the call", bool(calls))
    if calls:
        assert calls[0][0] == "get_weather", calls
        jsonschema.validate(json.loads(calls[0][1]), WEATHER["function"]["parameters"])
