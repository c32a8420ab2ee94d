"""Structural head pruning: the heads' rows and columns leave the Q/K/V/output kernels."""

import numpy as np

from keras_bertfam.analysis._common import (
    attention_groups, backbone_of, heads_per_layer, require_head_mask)
from keras_bertfam.models.backbone import _unique
from keras_bertfam.presets.deferred import deferred_initialization
from keras_bertfam.user_warnings import warn


def prune_heads(model, heads, allow_empty_layers=False):
    """A new model without the given attention heads (Michel et al. 2019; Voita et al. 2019).

    The pruned heads' slices of the query, key and value kernels and biases and their rows of the
    attention output kernel are removed, so the model has fewer parameters and FLOPs. The result's
    config records the heads of each layer (`heads_per_layer`), so it saves with
    `save_to_preset`, reloads, and exports like any model. It computes what the unpruned model
    computes with those heads masked (`head_mask` 0).

    Args:
        model: a backbone of an encoder family, or a task on one (the task is rebuilt on the
            pruned backbone with its own head weights). The model is not modified.
        heads: `{layer: [head, ...]}`, indices into the model's current heads (a model pruned
            before numbers its remaining heads 0..n-1, in their original order).
        allow_empty_layers: pruning every head of a layer leaves the layer's attention as its
            output bias alone (a residual pass-through); HF forbids it, so it needs this flag.

    ALBERT-style sharing: layers that share one attention sublayer prune together (the union of
    the heads given for any of them), with a warning naming the layers.

    Returns:
        The pruned model, of the same class as `model`.

    Example:
    >>> pruned = kb.analysis.prune_heads(classifier, {0: [1, 3], 5: [0]})  # doctest: +SKIP
    """
    backbone = backbone_of(model, "prune_heads")
    require_head_mask(backbone, "prune_heads")
    if model is not backbone and "backbone" not in model.get_config():
        raise TypeError(
            f"prune_heads rebuilds a task around its pruned backbone, and "
            f"{type(model).__name__} is not built on one backbone (it takes "
            f"{sorted(k for k in model.get_config() if k not in ('name', 'dtype', 'trainable'))})"
            f": prune its backbone (model.backbone) and build the task on it.")
    counts = heads_per_layer(backbone)
    plan = _plan(backbone, heads, counts, allow_empty_layers)
    if not any(plan.values()):
        warn("prune_heads: no head to prune; returning a copy of the model.")
    new_counts = [n - len(plan.get(i, ())) for i, n in enumerate(counts)]

    config = backbone.get_config()
    config["heads_per_layer"] = new_counts
    # Every weight of the new model is copied from `model`: built without drawing initial values
    # (as a preset load is), the copies become its values.
    with deferred_initialization():
        new_backbone = type(backbone).from_config(config)
        _copy_pruned_weights(backbone, new_backbone, plan, counts)
        if model is backbone:
            return new_backbone
        return _rebuild_task(model, new_backbone)


def _plan(backbone, heads, counts, allow_empty_layers):
    """{layer: sorted heads to remove}, validated and spread over layers sharing attention."""
    if not isinstance(heads, dict):
        raise TypeError(f"heads must be a dict {{layer: [head, ...]}}, got {type(heads).__name__}.")
    num_layers = len(counts)
    plan = {}
    for layer, layer_heads in heads.items():
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not (
                0 <= layer < num_layers):
            raise ValueError(f"Layer {layer!r} is out of range: the model has {num_layers} "
                             f"layers (0 to {num_layers - 1}).")
        layer = int(layer)
        layer_heads = [layer_heads] if isinstance(layer_heads, (int, np.integer)) else layer_heads
        for h in layer_heads:
            if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not (
                    0 <= h < counts[layer]):
                raise ValueError(
                    f"Head {h!r} of layer {layer} is out of range: the layer has {counts[layer]} "
                    f"heads (0 to {counts[layer] - 1}).")
        plan.setdefault(layer, set()).update(int(h) for h in layer_heads)

    # Layers that share one attention sublayer prune together.
    for members in attention_groups(backbone):
        if len(members) == 1:
            continue
        union = set().union(*(plan.get(i, set()) for i in members))
        if union and any(plan.get(i, set()) != union for i in members):
            warn(
                f"Layers {members} of this {backbone.family or 'model'} share one attention "
                f"sublayer (ALBERT's cross-layer sharing): heads {sorted(union)} are pruned in "
                "all of them.")
        for i in members:
            if union:
                plan[i] = set(union)

    for layer, removed in plan.items():
        if len(removed) == counts[layer] and not allow_empty_layers:
            raise ValueError(
                f"Pruning heads {sorted(removed)} would remove every head of layer {layer}; pass "
                "allow_empty_layers=True to allow a layer without attention (HF's prune_heads "
                "forbids it).")
    return {layer: sorted(removed) for layer, removed in plan.items() if removed}


def _copy_pruned_weights(old, new, plan, counts):
    """Copies every weight of `old` into `new`, slicing the attention projections by head."""
    done = set()
    pairs = [(i, o.attention.attention, n.attention.attention) for i in range(len(counts))
             for o, n in zip(old.encoder.layer_blocks(i), new.encoder.layer_blocks(i))]
    for i, old_mha, new_mha in pairs:  # every inner block of a layer (ALBERT's repetitions)
        if id(old_mha) in done:
            continue
        done.add(id(old_mha))
        keep = [h for h in range(counts[i]) if h not in plan.get(i, ())]
        if not keep:  # the old layer may already be empty: its bias alone
            old_bias = old_mha.output_bias if old_mha.output_dense is None else (
                old_mha.output_dense.bias)
            new_mha.output_bias.assign(np.asarray(old_bias))
        else:
            for name in ("query_dense", "key_dense", "value_dense"):
                src, dst = getattr(old_mha, name), getattr(new_mha, name)
                dst.kernel.assign(np.asarray(src.kernel)[:, keep, :])  # (H, N', Hd)
                dst.bias.assign(np.asarray(src.bias)[keep, :])  # (N', Hd)
            new_mha.output_dense.kernel.assign(
                np.asarray(old_mha.output_dense.kernel)[keep, :, :])  # (N', Hd, H)
            new_mha.output_dense.bias.assign(np.asarray(old_mha.output_dense.bias))
        for layer in (old_mha, new_mha):
            done.update(id(v) for v in layer.weights)
    old_rest = [v for v in _unique(old.weights) if id(v) not in done]
    new_rest = [v for v in _unique(new.weights) if id(v) not in done]
    if len(old_rest) != len(new_rest):
        raise RuntimeError(  # an encoder this function does not know
            f"prune_heads could not match the weights of {type(old).__name__}.")
    for src, dst in zip(old_rest, new_rest):
        if tuple(src.shape) != tuple(dst.shape):
            raise RuntimeError(f"prune_heads: {src.path} {src.shape} vs {dst.path} {dst.shape}.")
        dst.assign(np.asarray(src))


def _rebuild_task(task, backbone):
    """`task`'s class on `backbone`, with the task's own (non-backbone) weights copied."""
    config = task.get_config()
    config["backbone"] = backbone
    if "preprocessor" in config:
        config["preprocessor"] = getattr(task, "preprocessor", None)
    new_task = type(task).from_config(config)
    old_ids = {id(v) for v in task.backbone.weights}
    new_ids = {id(v) for v in backbone.weights}
    old_rest = [v for v in _unique(task.weights) if id(v) not in old_ids]
    new_rest = [v for v in _unique(new_task.weights) if id(v) not in new_ids]
    if [tuple(v.shape) for v in old_rest] != [tuple(v.shape) for v in new_rest]:
        raise RuntimeError(f"prune_heads could not match the head weights of "
                           f"{type(task).__name__}.")
    for src, dst in zip(old_rest, new_rest):
        dst.assign(np.asarray(src))
    return new_task  # uncompiled: compile it to train further
