"""The exported Hugging Face tokenizer gives the byte tokenizer's ids (tokenizers library, CPU).

The chat template through transformers (as SGLang applies it) is checked in tests/sglang, where
transformers is installed.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from ddtree.reference.hf_tokenizer import CHAT_TEMPLATE, byte_alphabet, write_hf_tokenizer
from ddtree.reference.tokenizer import SPECIALS, ByteTokenizer

TEXTS = ["", "def f(x):\n\treturn x + 1\n", "héllo wörld ☃ 🚀", " leading and trailing spaces ",
         "".join(map(chr, range(1, 128)))]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    write_hf_tokenizer(ByteTokenizer(), out, 2048)
    return out


def test_byte_alphabet_is_a_one_to_one_map_of_the_256_bytes():
    table = byte_alphabet()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "\u0120" and table[0] == "\u0100"


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_equals_the_byte_tokenizer(exported, text):
    fast = Tokenizer.from_file(str(exported / "tokenizer.json"))
    assert fast.encode(text).ids == ByteTokenizer().encode(text)
    assert fast.encode(text, add_special_tokens=False).ids == ByteTokenizer().encode(text, add_bos=False)


@pytest.mark.parametrize("text", TEXTS)
def test_decoding_gives_the_text_back_without_specials(exported, text):
    fast = Tokenizer.from_file(str(exported / "tokenizer.json"))
    ids = ByteTokenizer().encode(text) + [SPECIALS["<eos>"]]
    assert fast.decode(ids, skip_special_tokens=True) == text == ByteTokenizer().decode(ids)


def test_special_tokens_keep_the_projects_ids(exported):
    fast = Tokenizer.from_file(str(exported / "tokenizer.json"))
    assert {name: fast.token_to_id(name) for name in SPECIALS} == SPECIALS
    assert fast.get_vocab_size() == ByteTokenizer().vocab_size


def test_config_names_the_specials_and_carries_the_chat_template(exported):
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == ("<bos>", "<eos>", "<pad>")
    assert config["chat_template"] == CHAT_TEMPLATE and config["model_max_length"] == 2048


def test_a_vocabulary_without_room_for_the_specials_is_refused(tmp_path):
    with pytest.raises(ValueError, match="special token ids"):
        write_hf_tokenizer(ByteTokenizer(vocab_size=256), tmp_path, 2048)
