"""DDTreeWorker on sglang 0.5.23's DFlashWorkerV2 (imported lazily: SGLang only).

Status (k26-ddtree 0.1.0): the class exists so that SGLang's registry, argument handling and
signature checks can be exercised, but its decode path (one DFlash draft pass -> build_tree ->
one target verify pass over budget + 1 tokens with the tree mask -> verify_tree -> keep the
accepted nodes' KV) is NOT implemented: DFlashWorkerV2.forward_batch_generation does draft
sampling, verify and accept in one method, and replacing its middle without copying SGLang's
code needs more work than this release holds. Constructing the worker therefore fails with a
clear message instead of silently serving the DFlash chain under the DDTREE name.

What the decode path has to respect in 0.5.23 (read from its source, for the next release):
- KV headroom: DFlashDraftInputV2.prepare_for_decode reserves 2 * speculative_num_draft_tokens
  slots past the committed length, and the req_to_token row headroom derives from the same value,
  so the verify width budget + 1 must be the server's speculative_num_draft_tokens while the draft
  keeps its own block (get_num_tokens_per_req_for_target_verify answers per worker; done).
  `--speculative-dflash-block-size` is an alias of `--speculative-num-draft-tokens`.
- Open, found 2026-11-29: DFlashWorkerV2.__init__ takes block_size = speculative_num_draft_tokens and
  calls draft_model.set_block_size(block_size) (a mismatch with the draft's config only warns). With
  the server at budget + 1 the draft would run budget + 1 wide, and the spec's draft answer
  (num_draft_tokens) would capture the draft runner that wide: the worker has to restore the draft's
  configured block after super().__init__, and the spec has to answer that block for the draft
  worker (read from the draft's config.json), before the first capture.
- With page size 1 the accepted path can be kept without moving KV or freeing slots: permute the
  request's reserved req_to_token window so the accepted nodes' slots come first (the rest stay
  reserved for the next step).
- The draft context takes the accepted nodes' target hidden states in path order at positions
  prefix + depth (_append_target_hidden_to_draft_kv_by_loc with commit_lens = accepted + 1).
- GenerationBatchResult's stride stays the block size: at most depth L + 1 = block tokens a step.
- Triton attention, TARGET_VERIFY: eager reads spec_info.custom_mask laid out exactly as
  glue.full_mask (per request N rows x (prefix + N) columns, mask_indptr = cumsum of
  N * (seq_len + N)); under graphs it copies the mask into a uint8 VerifyMask buffer sized by the
  backend's num_draft_tokens (maybe_create_verify_mask) - another reason the server's
  speculative_num_draft_tokens must be budget + 1. DFlashVerifyInput says topk = 1 "for backends
  that gate tree metadata by topk > 1": check every such gate before trusting the mask.
- Graph capture of the target: SGLang builds the capture input in DecodeCudaGraphRunner.get_spec_info
  and leaves custom_mask None for backends in _DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS (triton is one);
  the plugin's AFTER hook (plugin.capture_with_tree_mask) puts the runner's mask buffer in for the
  DDTREE target (done, contract-tested), so the decode path must always pass its FULL_MASK.
- Stage map for the decode branch, read from 0.5.23's DFlashWorkerV2.forward_batch_generation
  (prefill and idle branches can stay the parent's): (1) draft block: _ensure_draft_block_buffers,
  the block ids/positions/out_cache_loc (_prepare_dflash_draft_block_unchecked), noise embedding,
  kv_index_translator.plan(..., read_extent=block_size) and draft_model_runner.forward in
  TARGET_VERIFY mode - all block-wide, so they must see the draft's block, not the server's
  num_draft_tokens; (2) instead of _greedy_sample_from_vocab_parallel_head: the draft hidden states
  at depths 1..L through ddtree.tp.vocab_parallel_candidates (lm_head.shard_indices gives
  org_vocab_start_index / num_org_elements; the fused Triton shard path, measured on 2 H200s) and
  build_tree_from_candidates; (3) target verify over budget + 1 slots per request: its own
  out_cache_loc window from req_to_token[prefix : prefix + budget + 1], a second kv_loc plan with
  read_extent = budget + 1, DFlashVerifyInput(draft_token = tree tokens, positions = prefix + depth,
  draft_token_num = budget + 1, custom_mask = glue.full_mask) and prepare_for_verify; (4) instead
  of _accept_block: verify_tree with sampling_params_from_sglang on next_token_logits
  [bs * (budget + 1), V], its accept lengths and bonus passed through self._tp_sync.sync (the
  parent's rank-0 agreement) like the parent's DFLASH_ACCEPT_* sites, then glue.commit_plan /
  rewrite_req_to_token; (5) _append_target_hidden_to_draft_kv_by_loc with the accepted nodes'
  hidden rows and slots in path order and commit_lens = accepted + 1; (6) GenerationBatchResult
  with out_tokens [bs, block] (stride = block size) and speculative_num_draft_tokens as the
  scheduler's accounting expects. Logprobs, grammar, mamba state and DP attention paths of the
  parent are not covered by this plan and must be refused in validation first.
- Nothing of this can run on this project's machines (the server needs torch 2.14.1 + its
  kernels); the first run is on the production host, behind validate.yml (DDTREE vs NONE token
  by token), which must pass before the service is trusted.
"""

from __future__ import annotations

DECODE_READY = False   # the decode path exists; roles/preflight/vars/main.yml says the same (tests/ansible)

NOT_READY = ("k26-ddtree 0.1.0: the DDTREE decode path inside SGLang is not implemented yet "
             "(tree draft, tree verify, KV compaction); serve with --speculative-algorithm DFLASH "
             "(the chain: budget = block size - 1, top-k cap 1) until a release says otherwise")


class DDTreeNotReady(RuntimeError):
    """The DDTREE worker cannot serve in this release."""


def make_worker_class():
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    class DDTreeWorker(DFlashWorkerV2):
        """DFlash draft + DDTree verify (see the module docstring for what is missing)."""

        def __init__(self, *args, **kwargs):
            raise DDTreeNotReady(NOT_READY)

    return DDTreeWorker
