"""Plain-PyTorch reference pair (target + DFlash draft) and the ar / dflash / ddtree decoders."""

from ddtree.reference.config import DraftConfig, TargetConfig
from ddtree.reference.draft import DFlashDraft
from ddtree.reference.engine import Decoder, Generation, RequestParams, generate
from ddtree.reference.pair import Pair, init_pair, load_pair, save_pair
from ddtree.reference.target import TargetLM
from ddtree.reference.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "Decoder", "DFlashDraft", "DraftConfig", "Generation", "Pair", "RequestParams",
           "TargetConfig", "TargetLM", "generate", "init_pair", "load_pair", "save_pair"]
