"""Pretraining losses as pure keras.ops functions (float32 whatever the compute dtype)."""
from keras import ops


def weighted_sparse_ce(labels, logits, weights, epsilon=1e-5):
    """BERT's MLM loss: `Σ w·CE / (Σ w + 1e-5)` over prediction slots.

    labels (B, P) int, logits (B, P, V), weights (B, P) 0/1 (None: all ones, as Keras' missing
    `sample_weight`). Also returns the weighted accuracy.
    """
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    weights = ops.ones_like(labels, "float32") if weights is None else ops.cast(weights, "float32")
    ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)  # (B, P)
    denom = ops.sum(weights) + epsilon
    loss = ops.sum(ce * weights) / denom
    correct = ops.cast(ops.equal(ops.argmax(logits, axis=-1), labels), "float32")
    accuracy = ops.sum(correct * weights) / denom
    return loss, accuracy


def weight_sum(labels, weights):
    """What a weighted mean over `labels` (`weighted_sparse_ce`, a token accuracy) averages
    over: the sum of `weights` (broadcast to the labels), or the number of labels without them
    (`Task.metric_weights`)."""
    ones = ops.ones_like(labels, "float32")
    return ops.sum(ones if weights is None else ones * ops.cast(weights, "float32"))


def mean_sparse_ce(labels, logits):
    """Mean CE over examples (NSP, SOP) and the accuracy."""
    logits = ops.cast(logits, "float32")
    labels = ops.cast(ops.reshape(labels, (-1,)), "int32")
    loss = ops.mean(ops.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    accuracy = ops.mean(ops.cast(ops.equal(ops.argmax(logits, axis=-1), labels), "float32"))
    return loss, accuracy


def mlm_targets(y, sample_weight):
    """(mask_ids, mask_weights or None) from keras-hub's `y=mask_ids, sample_weight=weights` or
    our `y={"mask_ids", "mask_weights"}`; a `sample_weight` given to fit() wins; none at all
    means every prediction slot counts (all ones)."""
    if isinstance(y, dict):
        y, sample_weight = y["mask_ids"], (
            y.get("mask_weights") if sample_weight is None else sample_weight)
    if sample_weight is None:
        sample_weight = ops.ones_like(y, "float32")
    return y, sample_weight
