"""Head importance (Michel et al. 2019) and their iterative pruning loop."""
import csv
import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_bertfam.analysis._common import (
    backbone_of, full_mask, head_mask_override, heads_per_layer, per_layer, require_head_mask,
    value_and_grad)


@dataclasses.dataclass
class HeadImportance:
    """`importance` (L, N): the normalized scores; `raw`: before normalization; `accuracy_drop`
    (L, N): baseline metric minus the metric with only that head masked (None when not asked);
    `baseline`: the metric of the unmasked model; `metric`: its name. NaN marks pruned heads."""

    importance: np.ndarray
    raw: np.ndarray
    accuracy_drop: np.ndarray
    baseline: float
    metric: str


def _batches(task, data, batch_size):
    """(x, y[, sample_weight]) batches as NumPy, through the task's preprocessor when it has one.

    `data`: a `tf.data.Dataset` of (x, y) or (x, y, sample_weight) (raw strings with a
    preprocessor, model inputs without), or a tuple `(x, y)` of arrays / lists."""
    if isinstance(data, tf.data.Dataset):
        x, y = data, None
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = data
    else:
        raise TypeError("The data must be a tf.data.Dataset of (x, y) batches or a tuple (x, y).")
    x, y, sw, _ = task._prepare(x, y, None, batch_size, training=False)
    if not isinstance(x, tf.data.Dataset):
        x = tf.data.Dataset.from_tensor_slices((x, y) if sw is None else (x, y, sw)).batch(
            batch_size)
    out = []
    for element in x.as_numpy_iterator():
        if not isinstance(element, tuple) or len(element) < 2:
            raise ValueError("head_importance needs labels: each element must be (x, y) or "
                             "(x, y, sample_weight).")
        out.append(element if len(element) == 3 else (element[0], element[1], None))
    if not out:
        raise ValueError("The data is empty.")
    return out


def _metric_name(task, batch):
    x, y, sw = batch
    _, metrics = task.losses_and_metrics(y, task(x, training=False), sw)
    for name in ("accuracy", "f1", "exact_match"):
        if name in metrics:
            return name
    return next(iter(metrics), None)


class _Evaluator:
    """`evaluator(mask)`: the example-weighted mean of `metric` over `batches` with head mask
    `mask` (L, N). On TensorFlow the forward pass is one `tf.function` taking the mask as an
    argument, traced once per batch shape: the accuracy-drop loop runs it L x N times, and eager
    MiniLM forwards made that loop 35 s on four sentences."""

    def __init__(self, task, backbone, batches, metric, counts):
        self.batches = batches

        def run(x, y, sw, mask):
            with head_mask_override(backbone, per_layer(mask, counts)):
                _, metrics = task.losses_and_metrics(y, task(x, training=False), sw)
            return metrics[metric]

        self.run = tf.function(run, reduce_retracing=True) \
            if keras.backend.backend() == "tensorflow" else run

    def __call__(self, mask):
        m = ops.convert_to_tensor(np.nan_to_num(mask).astype("float32"))
        total, n = 0.0, 0
        for x, y, sw in self.batches:
            total += float(ops.convert_to_numpy(self.run(x, y, sw, m))) * len(y)
            n += len(y)
        return total / n


def evaluate_with_mask(task, data, mask=None, batch_size=32, metric=None):
    """The task's metric (accuracy for a classifier) on `data` with head mask `mask` (L, N)."""
    backbone = backbone_of(task, "evaluate_with_mask")
    require_head_mask(backbone, "evaluate_with_mask")
    batches = _batches(task, data, batch_size)
    metric = metric or _metric_name(task, batches[0])
    counts = heads_per_layer(backbone)
    return _Evaluator(task, backbone, batches, metric, counts)(
        full_mask(counts) if mask is None else mask)


def _importance(task, backbone, batches, mask, counts):
    """Sum over batches of |d loss / d head_mask| at `mask` (Michel et al.'s I_h)."""
    total = np.zeros(mask.shape, "float64")
    start = np.nan_to_num(mask).astype("float32")
    for x, y, sw in batches:
        def loss_of(m):
            with head_mask_override(backbone, per_layer(m, counts)):
                loss, _ = task.losses_and_metrics(y, task(x, training=False), sw)
            return loss

        _, grad = value_and_grad(loss_of, start)
        total += np.abs(grad)
    return np.where(np.isnan(mask), np.nan, total)


def normalize_importance(raw, exponent=2, normalize_global=False):
    """Per-layer L`exponent` normalization (Michel et al.; HF's bertology script), then
    optionally min-max over all heads."""
    raw = np.asarray(raw, "float64")
    norm = np.power(np.nansum(np.power(np.abs(raw), exponent), -1), 1.0 / exponent)
    out = raw / (norm[:, None] + 1e-20)
    if normalize_global:
        lo, hi = np.nanmin(out), np.nanmax(out)
        out = (out - lo) / (hi - lo + 1e-20)
    return out


def head_importance(task, data, batch_size=32, accuracy_drop=True, normalize_global=False,
                    mask=None, progress=None):
    """Michel et al. 2019's head importance scores, and the metric drop of masking each head.

    The importance of head h is `sum over batches |d loss / d xi_h|` at a head mask `xi` of ones
    (the task's own loss on its labels, a mean over each batch), normalized per layer by the L2
    norm of the layer's scores (the paper; HF's bertology script), and with
    `normalize_global=True` also min-max over all heads (HF's default).

    Args:
        task: a task on an encoder family's backbone (a classifier, token classifier, QA...).
        data: `(x, y)` or a `tf.data.Dataset` of (x, y) batches: raw strings when the task has a
            preprocessor, model inputs otherwise.
        accuracy_drop: also mask one head at a time and measure the metric (accuracy for a
            classifier): L x N more passes over the data.
        mask: an (L, N) starting head mask (0 = already masked), as in the pruning loop.
        progress: optional callable `progress(k)` after each masked-head pass (or once, at the
            end, without `accuracy_drop`).

    Returns:
        `HeadImportance`.
    """
    backbone = backbone_of(task, "head_importance")
    require_head_mask(backbone, "head_importance")
    if not hasattr(task, "losses_and_metrics"):
        raise TypeError(f"head_importance takes a kb.tasks task (it needs the task's loss), got "
                        f"{type(task).__name__}.")
    counts = heads_per_layer(backbone)
    start = full_mask(counts) if mask is None else np.asarray(mask, "float32")
    if start.shape != (len(counts), max(counts)):
        raise ValueError(f"mask must have shape {(len(counts), max(counts))}, got {start.shape}.")
    batches = _batches(task, data, batch_size)
    raw = _importance(task, backbone, batches, start, counts)
    importance = normalize_importance(raw, normalize_global=normalize_global)
    metric = _metric_name(task, batches[0])
    evaluate = _Evaluator(task, backbone, batches, metric, counts) if metric else None
    baseline = evaluate(start) if metric else None
    drop = None
    done = 0
    if accuracy_drop and metric:
        drop = np.full(start.shape, np.nan)
        for layer, n in enumerate(counts):
            for head in range(n):
                if start[layer, head] == 0:
                    continue
                masked = start.copy()
                masked[layer, head] = 0.0
                drop[layer, head] = baseline - evaluate(masked)
                done += 1
                if progress is not None:
                    progress(done)
    elif progress is not None:
        progress(1)
    return HeadImportance(importance, raw, drop, baseline, metric)


@dataclasses.dataclass
class PruningCurve:
    """One row per step: heads pruned, their fraction, the metric; the mask of each step."""

    rows: list  # dicts: step, heads_pruned, fraction_pruned, metric
    masks: list  # (L, N) float arrays, 0 = pruned
    metric: str

    def plan(self, step=-1):
        """`{layer: [heads]}` masked at `step`, for `prune_heads`."""
        mask = self.masks[step]
        return {i: [int(h) for h in np.flatnonzero(row == 0)] for i, row in enumerate(mask)
                if (row == 0).any()}

    def write(self, output_dir, title="pruning curve"):
        """`pruning_curve.csv` and `pruning_curve.png` in `output_dir`; returns their paths."""
        from keras_bertfam.analysis.plots import plot_curve

        os.makedirs(output_dir, exist_ok=True)
        table = os.path.join(output_dir, "pruning_curve.csv")
        with open(table, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            writer.writeheader()
            writer.writerows(self.rows)
        xs = [100 * r["fraction_pruned"] for r in self.rows]
        ys = [r[self.metric] for r in self.rows]
        png = plot_curve({self.metric: (xs, ys)}, os.path.join(output_dir, "pruning_curve.png"),
                         "% of heads pruned", f"dev {self.metric}", title)
        return table, png


def iterative_pruning(task, data, target=0.5, step=0.1, importance_data=None, batch_size=32,
                      allow_empty_layers=False, progress=None):
    """Michel et al.'s loop: mask the least important `step` of the heads, re-score, repeat until
    `target` (a fraction of all heads) is masked, measuring the metric on `data` at each step.

    Importance is scored on `importance_data` (default: `data`) with the heads masked so far;
    masked heads are never picked again. A layer keeps at least one head unless
    `allow_empty_layers`. The heads are masked, not removed: `prune_heads(task, curve.plan())`
    removes them.

    Returns:
        `PruningCurve` (`.rows`, `.masks`, `.plan(step)`, `.write(dir)` -> CSV + PNG).
    """
    backbone = backbone_of(task, "iterative_pruning")
    require_head_mask(backbone, "iterative_pruning")
    if not 0 < target < 1:
        raise ValueError(f"target must be a fraction of the heads in (0, 1), got {target!r}.")
    if not 0 < step <= target:
        raise ValueError(f"step must be in (0, target={target}], got {step!r}.")
    counts = heads_per_layer(backbone)
    total = sum(counts)
    per_step = max(1, int(round(step * total)))
    goal = int(round(target * total))
    batches = _batches(task, data, batch_size)
    score_batches = batches if importance_data is None else _batches(task, importance_data,
                                                                     batch_size)
    metric = _metric_name(task, batches[0])
    mask = full_mask(counts)
    rows, masks = [], []
    evaluate = _Evaluator(task, backbone, batches, metric, counts)

    def record(i):
        value = evaluate(mask)
        pruned = int(np.nansum(mask == 0))
        rows.append({"step": i, "heads_pruned": pruned, "fraction_pruned": pruned / total,
                     metric: value})
        masks.append(mask.copy())
        if progress is not None:
            progress(rows[-1])

    record(0)
    i = 0
    while int(np.nansum(mask == 0)) < goal:
        i += 1
        scores = normalize_importance(_importance(task, backbone, score_batches, mask, counts))
        scores = np.where(np.isnan(mask) | (mask == 0), np.inf, scores)
        alive = np.nansum(mask, -1)
        n = min(per_step, goal - int(np.nansum(mask == 0)))
        chosen = 0
        for idx in np.argsort(scores, axis=None):
            if chosen == n or not np.isfinite(scores.flat[idx]):
                break
            layer = idx // mask.shape[1]
            if alive[layer] <= 1 and not allow_empty_layers:
                continue  # the last head of a layer stays
            mask.flat[idx] = 0.0
            alive[layer] -= 1
            chosen += 1
        if not chosen:
            break
        record(i)
    return PruningCurve(rows, masks, metric)
