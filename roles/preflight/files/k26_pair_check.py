"""Preflight's reading of the target's and the draft's config.json on the host (read-only): what
makes the pair unable to serve DFLASH / DDTREE, each as one line naming the field and the fix.

    python3 k26_pair_check.py TARGET_DIR DRAFT_DIR BLOCK_SIZE [SERVER_KIND [DDTREE_ATTENTION_BACKEND]]

DDTREE_ATTENTION_BACKEND (given when the service runs DDTREE): an MLA target (Kimi K2.6) takes only the
attention backends DDTREE was proven with on MLA (triton; the plugin refuses the others at start-up too).

Reads the formats the deployment serves: Kimi K2.6's KimiK25ForConditionalGeneration (the text model
under text_config), DeepseekV3ForCausalLM, Qwen3-style targets and the reference engine's; z-lab's
DFlashDraftModel (dflash_config) and the reference draft. Prints a JSON list (empty: the pair fits).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def text_config(target: dict) -> dict:
    """The language model's fields (a vision wrapper keeps them under text_config)."""
    return target.get("text_config") or target


def lm_head_quantized(target: dict) -> bool:
    """True when the checkpoint's quantization covers the LM head (not in its ignore list)."""
    q = text_config(target).get("quantization_config") or target.get("quantization_config")
    if not q:
        return False
    ignored = q.get("ignore") or []
    return not any(name == "lm_head" or (name.startswith("re:") and re.fullmatch(name[3:], "lm_head"))
                   for name in ignored)


# the attention backends DDTREE was proven with on an MLA target (ddtree.sglang.setup.refusals.MLA_MASK_BACKENDS)
MLA_BACKENDS = ("triton",)


def problems(target: dict, draft: dict, block_size: int, target_dir: str, draft_dir: str,
             server_kind: str = "sglang", ddtree_backend: str = "") -> list[str]:
    """server_kind sglang: SGLang's capture rule for the draft's target layers applies (the reference
    engine reads any layer's output); ddtree_backend: the attention backend of a DDTREE service."""
    text = text_config(target)
    dflash = draft.get("dflash_config") or {}
    found = []
    hidden, layers, vocab = text.get("hidden_size"), text.get("num_hidden_layers"), text.get("vocab_size")
    if draft.get("hidden_size") != hidden:
        found.append(f"the draft's hidden_size {draft.get('hidden_size')} ({draft_dir}/config.json) is not the target's "
                     f"{hidden}: the draft reads the target's hidden states and shares its embeddings; use the draft "
                     "trained for this target")
    if draft.get("vocab_size") not in (None, vocab):
        found.append(f"the draft's vocab_size {draft.get('vocab_size')} is not the target's {vocab}: its candidates go "
                     "through the target's LM head; use the draft trained for this target")
    mask = dflash.get("mask_token_id", draft.get("mask_token_id"))
    if mask is None or vocab is None or not 0 <= int(mask) < int(vocab):
        found.append(f"the draft's mask_token_id {mask} is not a token of the target's vocabulary (0..{vocab - 1 if vocab else '?'}): "
                     "set dflash_config.mask_token_id to the mask token the draft was trained with")
    ids = dflash.get("target_layer_ids", draft.get("target_layer_ids")) or []
    late = [i for i in ids if layers is None or not 0 <= int(i) < int(layers) - 1]
    if late and server_kind == "sglang":
        found.append(f"the draft's target_layer_ids {late} are not below the target's last layer ({layers} layers): SGLang "
                     "captures layer k's output as the input of layer k + 1; use the draft trained for this target")
    block = dflash.get("block_size", draft.get("block_size"))
    if block is not None and int(block) != block_size:
        found.append(f"k26_dflash_block_size={block_size} differs from the draft's block_size {block} "
                     f"({draft_dir}/config.json): set k26_dflash_block_size={block}")
    if lm_head_quantized(target):
        found.append(f"the target's quantization_config ({target_dir}/config.json) covers lm_head: the draft's candidates "
                     "and the verify pass need the full-precision LM head; use a checkpoint whose quantization ignores lm_head")
    if server_kind == "sglang" and ddtree_backend and text.get("kv_lora_rank") and ddtree_backend not in MLA_BACKENDS:
        found.append(f"k26_attention_backend={ddtree_backend} is not proven for DDTREE on this multi-head latent attention "
                     f"target ({target_dir}/config.json has kv_lora_rank): FlashInfer's verify graphs failed on the test "
                     f"bed's Kimi-shaped pair; set k26_attention_backend={MLA_BACKENDS[0]}")
    return found


def main(argv: list[str]) -> int:
    target_dir, draft_dir, block = argv[0], argv[1], int(argv[2])
    server_kind = argv[3] if len(argv) > 3 else "sglang"
    ddtree_backend = argv[4] if len(argv) > 4 else ""
    configs = []
    for directory in (target_dir, draft_dir):
        try:
            configs.append(json.loads((Path(directory) / "config.json").read_text()))
        except (OSError, ValueError) as err:
            print(json.dumps([f"{directory}/config.json cannot be read ({err})"]))
            return 0
    print(json.dumps(problems(configs[0], configs[1], block, target_dir, draft_dir, server_kind, ddtree_backend)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
