"""A request's text as its tokens arrive, without decoding the whole answer at every event.

`IncrementalText.add` decodes only a short window: the tokens since the last place where the text
was complete (`read`) plus the few before it (`prefix`, the context a tokenizer needs at the
window's start, e.g. a word-start marker). Text up to `read` is committed once and never decoded
again; the tail after it is decoded again until it no longer ends in the replacement character (a
multi-byte character split over events). The text equals `tokenizer.decode(tokens)` after every event
for a byte-level tokenizer and a byte-level BPE; `StopScan` then finds stop strings in the new text
only (with the stop strings' length - 1 of overlap), so one answer costs time linear in its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

REPLACEMENT = "\ufffd"


class Decodes(Protocol):
    def decode(self, ids: list[int]) -> str: ...


@dataclass
class IncrementalText:
    tokenizer: Decodes
    tokens: list[int] = field(default_factory=list)   # every token so far (grows in place)
    committed: str = ""                                # text of tokens[:read], final
    prefix: int = 0                                    # window start: the tokens before `read` re-decoded for context
    read: int = 0                                      # tokens whose text is committed
    tail: str = ""                                     # text of tokens[read:], may end in a split character

    @property
    def text(self) -> str:
        return self.committed + self.tail

    def add(self, new: list[int]) -> str:
        """Append `new` ([n] ids) and return the whole text so far."""
        self.tokens.extend(new)
        before = self.tokenizer.decode(self.tokens[self.prefix:self.read])
        window = self.tokenizer.decode(self.tokens[self.prefix:])
        fresh = window[len(before):]
        if fresh and not fresh.endswith(REPLACEMENT):
            self.committed += fresh
            self.prefix, self.read, self.tail = self.read, len(self.tokens), ""
        else:
            self.tail = fresh
        return self.text


@dataclass
class StopScan:
    """The first stop string in a growing text, searching each part of it once (plus an overlap)."""

    stops: list[str]
    checked: int = 0              # text before this offset holds no stop string's start

    def cut(self, text: str, settled: int) -> tuple[str, bool]:
        """Text up to the first stop string (excluded), and whether one was found. `settled`: the
        length of the text that will not change any more (IncrementalText.committed)."""
        stops = [s for s in self.stops if s]
        if not stops:
            return text, False
        start = max(0, self.checked - max(len(s) for s in stops) + 1)
        found = min((i for i in (text.find(s, start) for s in stops) if i >= 0), default=-1)
        self.checked = max(self.checked, settled)
        return (text[:found], True) if found >= 0 else (text, False)
