"""A byte-level tokenizer that needs no download: ids 0..255 are bytes, then 4 specials."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SPECIALS = {"<bos>": 256, "<eos>": 257, "<mask>": 258, "<pad>": 259}


@dataclass(frozen=True)
class ByteTokenizer:
    vocab_size: int = 256 + len(SPECIALS)    # the bytes, then the specials
    bos_token_id: int = SPECIALS["<bos>"]
    eos_token_id: int = SPECIALS["<eos>"]
    mask_token_id: int = SPECIALS["<mask>"]
    pad_token_id: int = SPECIALS["<pad>"]

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id] + ids if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        """Bytes back to text; special tokens are dropped, broken UTF-8 is replaced."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """'<|role|>\\ncontent\\n' per message, then the assistant header."""
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
        return self.encode(text)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"type": "byte", "vocab_size": self.vocab_size,
                                          "special_tokens": SPECIALS}, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "ByteTokenizer":
        data = json.loads(Path(path).read_text())
        if data.get("type") != "byte":
            raise ValueError(f"{path}: type={data.get('type')!r} is not supported; expected 'byte'")
        return cls(vocab_size=int(data["vocab_size"]))
