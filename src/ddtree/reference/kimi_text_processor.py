"""A text-only stand-in for Kimi K2.6's own processor, written into a test pair's Kimi-wrapper target.

Why: SGLang 0.5.23 builds the multimodal processor of a `KimiK25ForConditionalGeneration` checkpoint
even with --skip-tokenizer-init (`AutoProcessor.from_pretrained(model path)`), and its Kimi processor
reads `tokenizer`, `image_processor` and `media_processor.media_proc_cfg` from it. The real checkpoint
ships that processor as remote code; a test pair has none, and `--language-model-only` is refused for
this architecture. This module is this project's own code (no file of Kimi's), copied next to the
test pair's config.json by `python -m ddtree.reference.export --kimi-wrapper` and named in its
processor_config.json's auto_map, so `sglang serve --trust-remote-code` loads the wrapper as it
loads Kimi K2.6. It serves text only: the test pair has no vision weights, and a request with an
image is refused by the processor with that reason.

Loaded by transformers as remote code (the project itself only copies its text): it imports only the
standard library and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from transformers import AutoTokenizer
from transformers.image_processing_utils import BaseImageProcessor

PROCESSOR_CONFIG = "processor_config.json"


class KimiTextOnlyProcessor:
    """tokenizer: the pair's Hugging Face tokenizer; image_processor: a bare BaseImageProcessor that
    refuses images; media_processor.media_proc_cfg: the media settings SGLang's Kimi processor reads."""

    def __init__(self, tokenizer, media_proc_cfg: dict):
        self.tokenizer = tokenizer
        self.image_processor = _NoImages()
        self.media_processor = SimpleNamespace(media_proc_cfg=dict(media_proc_cfg),
                                               media_tokens_calculator=_no_media)

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs) -> KimiTextOnlyProcessor:
        config = json.loads((Path(path) / PROCESSOR_CONFIG).read_text())
        return cls(AutoTokenizer.from_pretrained(path), config["media_proc_cfg"])

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoProcessor") -> None:
        """transformers registers a remote processor class after loading it; nothing to keep here."""

    def __call__(self, *args, images=None, **kwargs):
        if images:
            _no_media()
        return self.tokenizer(*args, **kwargs)


def _no_media(*args, **kwargs):
    raise ValueError("this test pair's Kimi wrapper has no vision weights: send text only "
                     "(images are served by Kimi K2.6's own processor on the production host)")


class _NoImages(BaseImageProcessor):
    def preprocess(self, images, **kwargs):
        _no_media()
