"""The byte tokenizer as a Hugging Face fast tokenizer, so `sglang serve` tokenizes text itself.

    write_hf_tokenizer(ByteTokenizer(), DIR, max_length)
        -> DIR/tokenizer.json          a byte-level BPE with no merges: id b is byte b (0..255), then
                                       the specials <bos> 256, <eos> 257, <mask> 258, <pad> 259;
                                       encoding text adds <bos> in front (as ByteTokenizer.encode)
           DIR/tokenizer_config.json   PreTrainedTokenizerFast, its special tokens and a chat template
                                       that gives ByteTokenizer.apply_chat_template's ids

Production serves Kimi K2.6 with its own tokenizer and template (`--trust-remote-code`); the test pair
gets this one, so the OpenAI routes (chat, completions) and `/generate` with text run on the test
bed as they do there, without `--skip-tokenizer-init`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from ddtree.reference.tokenizer import SPECIALS, ByteTokenizer

# ByteTokenizer.apply_chat_template as Jinja: '<|role|>\ncontent\n' per message after <bos>, then
# the assistant header when a generation prompt is asked for (SGLang asks for one)
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def byte_alphabet() -> dict[int, str]:
    """Byte -> the printable character the ByteLevel pre-tokenizer writes for it (GPT-2's table:
    printable Latin-1 bytes stand for themselves, the others are shifted above U+0100 in order)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in kept}
    shifted = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return dict(sorted(table.items()))


def build_tokenizer(tok: ByteTokenizer) -> Tokenizer:
    """The fast tokenizer: bytes by id, the specials after them, <bos> added in front of a text."""
    vocab = {char: byte for byte, char in byte_alphabet().items()}       # 256 entries, id = byte
    fast = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    fast.decoder = decoders.ByteLevel()
    fast.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in SPECIALS])
    ids = {name: fast.token_to_id(name) for name in SPECIALS}
    if ids != SPECIALS or tok.vocab_size < 256 + len(SPECIALS):
        raise ValueError(f"special token ids {ids} differ from the byte tokenizer's {SPECIALS} "
                         f"(vocab_size {tok.vocab_size}): the exported tokenizer would not match the model")
    fast.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                        special_tokens=[("<bos>", tok.bos_token_id)])
    return fast


def tokenizer_config(max_length: int) -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
            "pad_token": "<pad>", "mask_token": "<mask>", "model_max_length": max_length,
            "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}


def write_hf_tokenizer(tok: ByteTokenizer, directory: Path, max_length: int) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer(tok).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(max_length), indent=1) + "\n")
