"""ddtree.serve.detokenize: the text of a growing answer equals decoding the whole answer after every
event (byte tokenizer with split multi-byte characters, broken bytes and specials; a trained
byte-level BPE from the tokenizers library), stop strings are found where a scan of the whole text
finds them, and one answer costs decoding work linear in its length (20,000 tokens, one per event)."""

from __future__ import annotations

import random

import pytest
from tokenizers import ByteLevelBPETokenizer

from ddtree.reference.tokenizer import ByteTokenizer
from ddtree.serve.detokenize import IncrementalText, StopScan

TEXT = ("héllo wörld ☃ 🚀 naïve café – “quotes” 日本語のテキスト def f(x):\n\treturn x + 1\n" * 3)


def chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    """ids cut into events of 1..6 tokens (a speculative step emits several)."""
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 6)
        out.append(ids[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(20))
def test_byte_tokenizer_text_equals_the_whole_decode_after_every_event(seed):
    rng = random.Random(seed)
    tok = ByteTokenizer()
    ids = tok.encode(TEXT, add_bos=False)
    # broken UTF-8 and special tokens in the middle: the whole decode replaces / drops them
    for _ in range(5):
        ids.insert(rng.randrange(len(ids)), rng.choice([0xFF, 0xC3, 0xE2, tok.eos_token_id, tok.pad_token_id]))
    text, seen = IncrementalText(tok), []
    for event in chunks(ids, rng):
        seen += event
        assert text.add(event) == tok.decode(seen)
    assert text.tokens == ids


@pytest.fixture(scope="module")
def bpe():
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([TEXT, "The quick brown fox jumps over the lazy dog. " * 20], vocab_size=400,
                            min_frequency=1, show_progress=False)
    return tok


@pytest.mark.parametrize("seed", range(10))
def test_a_byte_level_bpe_text_equals_the_whole_decode_after_every_event(bpe, seed):
    rng = random.Random(seed)
    ids = bpe.encode(TEXT + "The quick brown fox, 🚀🚀 and ☃.").ids
    assert max(ids) > 255                       # merged tokens, some of them parts of a character
    text, seen = IncrementalText(bpe), []
    for event in chunks(ids, rng):
        seen += event
        assert text.add(event) == bpe.decode(seen)
    assert text.text == TEXT + "The quick brown fox, 🚀🚀 and ☃."


class Counting:
    """A tokenizer that counts the ids it was asked to decode."""

    def __init__(self):
        self.inner, self.decoded = ByteTokenizer(), 0

    def decode(self, ids):
        self.decoded += len(ids)
        return self.inner.decode(ids)


def test_a_long_answer_costs_decoding_work_linear_in_its_length():
    tok, n = Counting(), 20_000
    ids = (ByteTokenizer().encode("日本語 and ascii 🚀 ", add_bos=False) * 1000)[:n]
    text = IncrementalText(tok)
    for t in ids:
        text.add([t])
    assert text.text == ByteTokenizer().decode(ids)
    # each id is decoded a handful of times (its window and the next), never the whole answer again:
    # decoding the whole answer at every event, as before, is n * (n + 1) / 2 = 200 million ids
    assert tok.decoded <= 6 * n, tok.decoded


def whole_scan(text: str, stops: list[str]) -> tuple[str, bool]:
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


@pytest.mark.parametrize("seed", range(30))
def test_stop_strings_are_found_where_a_whole_scan_finds_them(seed):
    rng = random.Random(seed)
    tok = ByteTokenizer()
    alphabet = "ab☃ \n"
    body = "".join(rng.choice(alphabet) for _ in range(300))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
    text, scan, seen = IncrementalText(tok), StopScan(stops), []
    for event in chunks(tok.encode(body, add_bos=False), rng):
        seen += event
        got = scan.cut(text.add(event), len(text.committed))
        assert got == whole_scan(tok.decode(seen), stops), (stops, got)
        if got[1]:
            break


def test_no_stop_strings_and_empty_ones_find_nothing():
    assert StopScan([]).cut("anything", 8) == ("anything", False)
    assert StopScan([""]).cut("anything", 8) == ("anything", False)
