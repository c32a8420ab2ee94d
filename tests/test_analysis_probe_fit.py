"""kb.analysis.probe / edge_probe train each probe from one data iterator over the repeated,
reshuffled examples, not one iterator per epoch (Keras opens one per epoch given arrays)."""
import numpy as np
import tensorflow as tf

import keras_bertfam as kb


def test_probe_reads_one_iterator_per_probe(monkeypatch):
    backbone = kb.models.BertBackbone(30, 2, 2, 16, 32, max_sequence_length=16)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 30, (24, 8)).astype("int32")
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                "padding_mask": np.ones_like(ids)}
    labels = (ids[:, 1] > 17).astype("int64")
    opened = []
    original = tf.data.Dataset.__iter__
    monkeypatch.setattr(tf.data.Dataset, "__iter__",
                        lambda self: opened.append(self) or original(self))
    result = kb.analysis.probe(backbone, (features, labels), layers=[0, 2], epochs=10,
                               batch_size=8)
    assert result.layers == [0, 2] and len(result.scores) == 2
    assert all(0.0 <= s <= 1.0 for s in result.scores + result.train_scores)
    # per probe: one for its 10 epochs (18 training examples: 3 batches each) and those of its
    # two evaluations (Keras opens 2 per evaluation of arrays); it was 24 per probe
    assert len(opened) <= 2 * 5, len(opened)
