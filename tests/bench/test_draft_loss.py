"""train_pair's draft loss: block positions weighted by depth_weights (--depth-decay, DFlash's reweighting toward a
block's early positions), the plain mean at decay 0; computed here again from the same anchors as the oracle."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.reference.conftest import small_vocab_pair


def test_depth_weights_average_one_and_fall_by_the_decay():
    from training import train_pair
    assert torch.equal(train_pair.depth_weights(7, 0.0), torch.ones(7))
    w = train_pair.depth_weights(7, 4.0)
    assert w.mean().item() == pytest.approx(1.0)
    assert all(b / a == pytest.approx(math.exp(-1 / 4)) for a, b in zip(w[:-1].tolist(), w[1:].tolist()))


@pytest.mark.parametrize("decay", [0.0, 3.0])
def test_draft_loss_weights_each_depths_cross_entropy(decay):
    from training import train_pair
    pair = small_vocab_pair(vocab=16, seed=2, std=0.3, block_size=4)
    x = torch.randint(2, 15, (3, 24), generator=torch.Generator().manual_seed(1))          # [bs, T]
    loss, accuracy = train_pair.draft_loss(pair.target, pair.draft, x, 5, torch.Generator().manual_seed(7),
                                           decay=decay)
    # the oracle: the same anchors (the same generator state), cross-entropy per depth, weighted by hand
    gen, depth = torch.Generator().manual_seed(7), 3
    hidden = pair.target.forward_sequence(x, capture=tuple(pair.draft.config.target_layer_ids)).hidden
    anchors = torch.randint(1, 24 - depth, (3, 5), generator=gen)                           # [bs, K]
    logits = pair.draft.block_logits(hidden, x, anchors)                                    # [bs, K, L, V]
    labels = x.gather(1, (anchors[:, :, None] + torch.arange(1, depth + 1)).reshape(3, -1)).view(3, 5, depth)
    per_depth = [F.cross_entropy(logits[:, :, k].reshape(-1, 16), labels[:, :, k].reshape(-1)).item()
                 for k in range(depth)]
    weights = [1.0] * depth if decay == 0 else [math.exp(-k / decay) for k in range(depth)]
    want = sum(w * c for w, c in zip(weights, per_depth)) / sum(weights)
    assert loss.item() == pytest.approx(want, rel=1e-6)        # draft_loss takes the cross-entropy in float32
    assert accuracy.shape == (depth,)
    if decay:
        assert loss.item() != pytest.approx(sum(per_depth) / depth, rel=1e-4)      # the weighting changed it
