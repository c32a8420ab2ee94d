"""The shared building blocks: attention paths, sharing plans, heads, config round trips."""
import keras
import numpy as np
import pytest
from keras import ops

from keras_bertfam.layers import (
    MaskedLMHead,
    MultiHeadSelfAttention,
    TextEmbedding,
    TransformerBlock,
    TransformerStack,
    gather_positions,
    sharing_plan,
)
from tests.conftest import to_numpy

pytestmark = pytest.mark.multibackend


def _x(b=2, t=5, h=8, seed=0):
    return np.random.RandomState(seed).randn(b, t, h).astype("float32")


def test_fused_and_explicit_attention_agree():
    layer = MultiHeadSelfAttention(num_heads=2, hidden_dim=8)
    x = _x()
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    fused = to_numpy(layer(x, padding_mask=mask))
    explicit, probs = layer(x, padding_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(fused, to_numpy(explicit), atol=1e-5)
    probs = to_numpy(probs)
    assert probs.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert np.all(probs[0, :, :, 3:] < 1e-6)  # padded keys get no attention


def test_head_mask_zeroes_a_head():
    layer = MultiHeadSelfAttention(num_heads=2, hidden_dim=8)
    x = _x()
    out, probs = layer(x, head_mask=np.array([1.0, 0.0]), return_attention_scores=True)
    assert np.all(to_numpy(probs)[:, 1] == 0)
    # With head 1 removed, the output is the output projection of head 0 alone.
    v = to_numpy(layer.value_dense(x))[:, :, 0]  # (B, T, Hd)
    ctx0 = np.einsum("bts,bsh->bth", to_numpy(probs)[:, 0], v)
    w = to_numpy(layer.output_dense.kernel)[0]  # (Hd, H)
    expected = ctx0 @ w + to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)


def test_bad_head_count():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadSelfAttention(num_heads=3, hidden_dim=8)


def test_sharing_plan_follows_albert_grouping():
    assert sharing_plan(12, 1, "all") == ([0] * 12, [0] * 12)
    att, ffn = sharing_plan(6, 3, "attention")
    assert att == [0, 0, 1, 1, 2, 2] and ffn == list(range(6))
    assert sharing_plan(4, 4, "none") == (list(range(4)), list(range(4)))
    with pytest.raises(ValueError, match="share"):
        sharing_plan(4, 1, "heads")
    with pytest.raises(ValueError, match="num_groups"):
        sharing_plan(4, 5, "all")


@pytest.mark.parametrize("share", ["none", "all", "attention", "ffn"])
def test_encoder_shares_weights_once(share):
    enc = TransformerStack(4, 8, 2, 16, share=share, num_groups=1 if share != "none" else None)
    enc(_x(t=3))
    per_attention = 4 * (8 * 8 + 8) + 2 * 8  # q, k, v, output projections + LayerNorm
    per_ffn = 8 * 16 + 16 + 16 * 8 + 8 + 2 * 8  # two Dense + LayerNorm
    n_attention = 1 if share in ("all", "attention") else 4
    n_ffn = 1 if share in ("all", "ffn") else 4
    distinct = {id(w): w for w in enc.weights}.values()
    assert sum(int(np.prod(w.shape)) for w in distinct) == n_attention * per_attention + n_ffn * per_ffn


def test_block_matches_manual_post_ln():
    block = TransformerBlock(hidden_dim=8, num_heads=2, intermediate_dim=16)
    x = _x()
    y = to_numpy(block(x))
    attn = block.attention
    h = to_numpy(attn.layer_norm(x + to_numpy(attn.attention(x))))
    ffn = block.feedforward
    inner = to_numpy(keras.activations.gelu(ffn.intermediate_dense(h), approximate=False))
    expected = to_numpy(ffn.layer_norm(h + to_numpy(ffn.output_dense(inner))))
    np.testing.assert_allclose(y, expected, atol=1e-5)


def test_embedding_projection_and_offset():
    emb = TextEmbedding(50, 10, embedding_dim=4, hidden_dim=8, num_segments=0, position_offset=2)
    out = emb(np.array([[1, 2, 3]]))
    assert tuple(out.shape) == (1, 3, 8)
    assert emb.segment_embedding is None
    assert tuple(emb.position_embedding.embeddings.shape) == (12, 4)
    config = emb.get_config()
    again = TextEmbedding.from_config(config)
    assert again.get_config() == config


def test_mlm_head_gathers_then_projects_on_tied_table():
    emb = keras.layers.Embedding(20, 8)
    emb.build((None,))
    head = MaskedLMHead(token_embedding=emb, intermediate_activation="gelu")
    seq = _x(t=6)
    positions = np.array([[1, 4], [0, 5]])
    logits = to_numpy(head(seq, positions))
    assert logits.shape == (2, 2, 20)
    gathered = to_numpy(gather_positions(seq, positions))
    np.testing.assert_allclose(gathered[1, 1], seq[1, 5])
    h = to_numpy(head.layer_norm(head.dense(gathered)))
    expected = h @ to_numpy(emb.embeddings).T + to_numpy(head.bias)
    np.testing.assert_allclose(logits, expected, atol=1e-5)
