"""Shared helpers of `kb.analysis`: which backbone, masks through a task, gradients per backend."""
import contextlib

import keras
import numpy as np
from keras import ops

from keras_bertfam.models.backbone import Backbone, EncoderBackbone


def backbone_of(model, what="this analysis"):
    """A task's backbone, or the backbone itself; a clear TypeError for anything else."""
    if isinstance(model, Backbone):
        return model
    backbone = getattr(model, "backbone", None)
    if isinstance(backbone, Backbone):
        return backbone
    raise TypeError(
        f"{what} takes a kb.tasks task or a kb.models backbone, got {type(model).__name__}.")


def family_name(backbone):
    return getattr(backbone, "family", None) or type(backbone).__name__


def banded_attention(backbone):
    """Longformer: sliding-window attention, whose probabilities are (N, T, G + w + 1) bands."""
    return "global_attention_mask" in getattr(backbone, "input", {})


def require_head_mask(backbone, what):
    """Head masks and pruning run on the shared encoder (every family but XLNet, Longformer)."""
    if isinstance(backbone, EncoderBackbone):
        return
    if banded_attention(backbone):
        why = ("its sliding-window attention (a local window plus separate global query / key / "
               "value projections) is not the shared encoder stack that kb.analysis masks and "
               "prunes. Probes work for it")
    else:
        why = ("its two-stream relative attention has no per-head mask. Attention maps and "
               "their statistics work for it")
    raise ValueError(
        f"{what} needs a head_mask, which the {family_name(backbone)!r} family "
        f"({type(backbone).__name__}) does not take: {why}; head importance and pruning work "
        "for BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA and SpanBERT.")


def heads_per_layer(backbone):
    """Current number of heads of each layer (after any structural pruning)."""
    counts = getattr(backbone, "heads_per_layer", None)
    if counts is not None:
        return [int(n) for n in counts]
    return [int(backbone.num_heads)] * int(backbone.num_layers)


def attention_groups(backbone):
    """The layers of each attention sublayer, in order: `[[0], [1], ...]`, or ALBERT's shared
    groups (`[[0, 1, 2, 3]]` when every layer shares one), whose heads are one set of weights."""
    encoder = backbone.encoder
    groups = {}
    for i in range(int(backbone.num_layers)):
        groups.setdefault(id(encoder.layer_block(i).attention), []).append(i)
    return list(groups.values())


def full_mask(counts, fill=1.0):
    """(L, Nmax) float32 array; entries past a pruned layer's count are NaN."""
    out = np.full((len(counts), max(counts) if counts else 0), np.nan, dtype="float32")
    for i, n in enumerate(counts):
        out[i, :n] = fill
    return out


def per_layer(mask, counts):
    """(L, Nmax) array / tensor -> what the encoder takes: the array itself when every layer has
    Nmax heads, else a list of per-layer (N_i,) slices."""
    if len(set(counts)) == 1:
        return mask
    return [mask[i, :n] for i, n in enumerate(counts)]


@contextlib.contextmanager
def head_mask_override(backbone, mask):
    """Runs the backbone (inside any task) with `mask` as its head mask; restores on exit."""
    encoder = backbone.encoder
    previous = getattr(encoder, "head_mask_override", None)
    object.__setattr__(encoder, "head_mask_override", mask)  # a tensor, not tracked state
    try:
        yield
    finally:
        object.__setattr__(encoder, "head_mask_override", previous)


def value_and_grad(fn, x):
    """`fn(x)` (a scalar) and its gradient with respect to the float32 array `x`, as NumPy,
    on the current Keras backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.convert_to_tensor(x, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = fn(x)
        return float(value), np.asarray(tape.gradient(value, x))
    if backend == "jax":
        import jax

        value, grad = jax.value_and_grad(lambda m: fn(m))(jax.numpy.asarray(x, "float32"))
        return float(value), np.asarray(grad)
    if backend == "torch":
        import torch

        x = ops.convert_to_tensor(np.asarray(x, "float32")).detach().requires_grad_(True)
        value = fn(x)
        (grad,) = torch.autograd.grad(value, x)
        return float(value.detach().cpu()), grad.detach().cpu().numpy()
    raise NotImplementedError(f"Gradients on the {backend!r} backend are not supported.")


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))
