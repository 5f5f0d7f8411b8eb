"""Run captured HTTP requests through SGLang 0.5.23's own request handling and the plugin's check.

    python tests/sglang/request_objects.py SERVER_ARGS_JSON < requests.json > verdicts.json

In a fresh interpreter (SGLang's process-wide context is published here, as the HTTP server's
process does): the plugins load, SGLang parses the server's command line, and each request
{"path", "body"} becomes the object SGLang's HTTP layer makes of it - /generate: GenerateReqInput;
/v1/chat/completions and /v1/completions: the OpenAI request model, turned into a GenerateReqInput
by SGLang's own OpenAIServingChat / OpenAIServingCompletion (the server's tokenizer and chat
template, its reasoning and tool-call parsers) - then normalised as the TokenizerManager does and
handed to the plugin's per-request hook (what SGLang calls before its own _validate_one_request).
Prints, per request, the path, the refusal (None when served) and the sampling parameters.
"""

from __future__ import annotations

import json
import sys


def build_servers(argv: list[str]):
    """SGLang's OpenAI handlers over the server's tokenizer, with the process context published."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    args = prepare_server_args(argv)
    publish(args, role="tokenizer")

    class TokenizerSide:
        """What the OpenAI handlers read of SGLang's TokenizerManager (which owns sockets and
        subprocesses): the server's arguments, model config, tokenizer and served name."""
        server_args = args
        model_config = ModelConfig.from_server_args(args)
        tokenizer = get_tokenizer(args.tokenizer_path or args.model_path, trust_remote_code=args.trust_remote_code)
        processor = None
        served_model_name = args.served_model_name

        def config_value(self, name):
            return getattr(args, name)

    side = TokenizerSide()
    templates = TemplateManager()
    templates.initialize_templates(side, model_path=args.model_path)
    return side, OpenAIServingChat(side, templates), OpenAIServingCompletion(side, templates)


def to_request_object(path: str, body: dict, chat, completion):
    """The GenerateReqInput SGLang's HTTP layer builds for one request."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput

    if path == "/generate":
        return GenerateReqInput(**body)
    if path == "/v1/chat/completions":
        return chat._convert_to_internal_request(ChatCompletionRequest(**body))[0]
    if path == "/v1/completions":
        return completion._convert_to_internal_request(CompletionRequest(**body))[0]
    raise ValueError(f"no SGLang handler known here for POST {path}: add it to tests/sglang/request_objects.py")


def verdict(path: str, body: dict, side, chat, completion) -> dict:
    from ddtree.sglang.plugin import refuse_unsupported_requests

    obj = to_request_object(path, body, chat, completion)
    obj.normalize_batch_and_arguments()
    try:
        refuse_unsupported_requests(side, obj, getattr(obj, "input_ids", None))
        refusal = None
    except ValueError as err:
        refusal = str(err)
    return {"path": path, "refusal": refusal, "sampling_params": obj.sampling_params,
            "return_logprob": obj.return_logprob, "top_logprobs_num": obj.top_logprobs_num}


def main() -> int:
    side, chat, completion = build_servers(json.loads(sys.argv[1]))
    requests = json.load(sys.stdin)
    json.dump([verdict(r["path"], r["body"], side, chat, completion) for r in requests], sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
