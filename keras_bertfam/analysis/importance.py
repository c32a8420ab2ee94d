"""Head importance (Michel et al. 2019) and their iterative pruning loop."""
import csv
import dataclasses
import os
import weakref

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_bertfam.analysis._common import (
    attention_groups, backbone_of, full_mask, head_mask_override, heads_per_layer, per_layer,
    require_head_mask, value_and_grad)
from keras_bertfam.user_warnings import warn


@dataclasses.dataclass
class HeadImportance:
    """`importance` (L, N): the normalized scores; `raw`: before normalization; `accuracy_drop`
    (L, N): how much the metric worsens with only that head masked (None when not asked): the
    baseline minus the masked metric for an accuracy, the masked minus the baseline for a loss
    (`lower_is_better`, e.g. a regression's `mse`), so that positive always means the head
    helps; `drop_name` names it (`accuracy_drop`, `mse_increase`); `baseline`: the metric of the
    unmasked model; `metric`: its name. NaN marks pruned heads, and in `importance` and
    `accuracy_drop` the heads the starting mask masks (`head_importance(mask=...)`)."""

    importance: np.ndarray
    raw: np.ndarray
    accuracy_drop: np.ndarray
    baseline: float
    metric: str
    lower_is_better: bool = False

    @property
    def drop_name(self):
        return f"{self.metric}_increase" if self.lower_is_better else f"{self.metric}_drop"


def _batches(task, data, batch_size):
    """(x, y[, sample_weight]) batches as NumPy, through the task's preprocessor when it has one.

    `data`: a `tf.data.Dataset` of (x, y) or (x, y, sample_weight) (raw strings with a
    preprocessor, model inputs without), or a tuple `(x, y)` of arrays / lists."""
    if isinstance(data, tf.data.Dataset):
        if int(data.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
            raise ValueError(
                "The dataset is infinite (a .repeat() without a count): head importance reads "
                "all of it; give a finite dataset, e.g. data.take(number_of_batches).")
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


_HIGHER_IS_BETTER = ("accuracy", "f1", "exact_match")
_LOWER_IS_BETTER = ("loss", "mse", "error")


def _metric_name(task, batch, name=None):
    """The task's accuracy-like metric (a name ending in accuracy / f1 / exact_match: a
    classifier's `accuracy`, a MaskedLM's `mlm_accuracy`), else its first metric; `name`, when
    given, checked against the task's metrics."""
    x, y, sw = batch
    _, metrics = task.losses_and_metrics(y, task(x, training=False), sw)
    if name is not None:
        if name not in metrics:
            raise ValueError(f"metric {name!r} is not one of {type(task).__name__}'s metrics: "
                             f"{sorted(metrics)}.")
        return name
    for suffix in _HIGHER_IS_BETTER:
        if suffix in metrics:
            return suffix
    for name in metrics:
        if name.endswith(_HIGHER_IS_BETTER):
            return name
    return next(iter(metrics), None)


def _lower_is_better(metric):
    """A loss (`mlm_loss`, a regression's `mse`): masking an important head raises it."""
    return bool(metric) and metric.endswith(_LOWER_IS_BETTER)


# task -> {(metric, heads per layer): its masked forward pass}: one per task and metric, so that
# head_importance, evaluate_with_mask and iterative_pruning on the same task trace it once, not
# once per call (weak keys: a dropped task takes its functions with it).
_MASKED_RUNS = weakref.WeakKeyDictionary()


def _masked_run(task, backbone, metric, counts):
    """`run(x, y, sw, mask)` -> (the batch's `metric` with head mask `mask`, its weight). On
    TensorFlow one `tf.function` taking the mask as an argument, traced once per batch shape
    and kept for the task (it reads the task's variables when it runs)."""
    runs = _MASKED_RUNS.setdefault(task, {})
    key = (metric, tuple(counts))
    if key in runs:
        return runs[key]
    task_ref = weakref.ref(task)  # (the function must not keep its task alive)

    def run(x, y, sw, mask):
        task = task_ref()
        with head_mask_override(backbone, per_layer(mask, counts)):
            y_pred = task(x, training=False)
            _, metrics = task.losses_and_metrics(y, y_pred, sw)
            rows = ops.cast(ops.shape(tf.nest.flatten(y_pred)[0])[0], "float32")
        return metrics[metric], task.metric_weights(y, y_pred, sw).get(metric, rows)

    runs[key] = tf.function(run, reduce_retracing=True) \
        if keras.backend.backend() == "tensorflow" else run
    return runs[key]


class _Evaluator:
    """`evaluator(mask)`: `metric` over all of `batches` (each batch's value weighted as the
    task's epoch means weight it, `Task.metric_weights`: the metric of the whole data) with head
    mask `mask` (L, N). On TensorFlow the forward pass is one `tf.function` taking the mask as an
    argument, traced once per batch shape and task (`_masked_run`): the accuracy-drop loop runs
    it L x N times, and eager MiniLM forwards made that loop 35 s on four sentences."""

    def __init__(self, task, backbone, batches, metric, counts):
        self.batches = batches
        self.run = _masked_run(task, backbone, metric, counts)

    def __call__(self, mask):
        m = ops.convert_to_tensor(np.nan_to_num(mask).astype("float32"))
        total, n = 0.0, 0.0
        for x, y, sw in self.batches:
            value, weight = (float(ops.convert_to_numpy(v)) for v in self.run(x, y, sw, m))
            if weight:
                total += value * weight
                n += weight
        return total / n if n else float("nan")


def evaluate_with_mask(task, data, mask=None, batch_size=32, metric=None):
    """The task's metric (accuracy for a classifier) on `data` with head mask `mask` (L, N)."""
    backbone = backbone_of(task, "evaluate_with_mask")
    require_head_mask(backbone, "evaluate_with_mask")
    counts = heads_per_layer(backbone)
    _require_heads(counts, "evaluate_with_mask")
    mask = _check_mask(mask, counts)
    batches = _batches(task, data, batch_size)
    metric = _metric_name(task, batches[0], metric)
    return _Evaluator(task, backbone, batches, metric, counts)(mask)


def _check_mask(mask, counts):
    """An (L, N) head mask as float32 (all ones when None), or a clear error."""
    if mask is None:
        return full_mask(counts)
    if isinstance(mask, dict) or isinstance(mask, (str, bytes)):
        raise TypeError(
            f"mask must be an (L, N) array of head multipliers (0 = masked), got a "
            f"{type(mask).__name__}; a {{layer: [heads]}} plan is what prune_heads takes.")
    mask = np.asarray(mask, "float32")
    expected = (len(counts), max(counts))
    if mask.shape != expected:
        raise ValueError(f"mask must have shape {expected} (layers, heads), got {mask.shape}.")
    heads = ~np.isnan(full_mask(counts))  # past a pruned layer's heads: not heads, ignored
    bad = heads & ~((mask >= 0) & (mask <= 1))  # NaN fails both
    if bad.any():
        layer, head = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"mask[{layer}, {head}] is {mask[layer, head]:g}: a head mask holds multipliers in "
            "[0, 1] (1 = kept, 0 = masked) for every head of the model.")
    return np.where(heads, mask, np.nan).astype("float32")


def _require_heads(counts, what):
    """A model pruned to no head at all has no head mask to score or evaluate."""
    if not sum(counts):
        raise ValueError(
            f"{what}: the model has no attention head left (heads_per_layer={counts}); there "
            "is no head to mask or score.")


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
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float, np.integer,
                                                                np.floating)) or not exponent > 0:
        raise ValueError(f"exponent must be a positive number (2: the L2 norm of each layer's "
                         f"scores), got {exponent!r}.")
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
        mask: an (L, N) starting head mask (0 = already masked), as in the pruning loop. The
            heads it masks keep their gradient in `raw` (HF's `compute_heads_importance` with
            that `head_mask`: how much unmasking the head would change the loss) and count in
            their layer's norm, so the other heads' scores are HF's; their own `importance`
            (and `accuracy_drop`) is NaN: no longer heads of the model, never ranked among the
            least important ones (HF's `mask_heads` sets them to inf before choosing, as
            `iterative_pruning` does).
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
    _require_heads(counts, "head_importance")
    start = _check_mask(mask, counts)
    batches = _batches(task, data, batch_size)
    raw = _importance(task, backbone, batches, start, counts)
    # HF's scores (its compute_heads_importance: a masked head's gradient in its layer's norm
    # too); a masked head's own score NaN, where HF's mask_heads puts inf before choosing
    importance = np.where(start == 0, np.nan,
                          normalize_importance(raw, normalize_global=normalize_global))
    metric = _metric_name(task, batches[0])
    evaluate = _Evaluator(task, backbone, batches, metric, counts) if metric else None
    baseline = evaluate(start) if metric else None
    lower = _lower_is_better(metric)
    sign = -1.0 if lower else 1.0
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
                drop[layer, head] = sign * (baseline - evaluate(masked))
                done += 1
                if progress is not None:
                    progress(done)
    elif progress is not None:
        progress(1)
    return HeadImportance(importance, raw, drop, baseline, metric, lower)


@dataclasses.dataclass
class PruningCurve:
    """One row per step: heads pruned, their fraction, the metric; the mask of each step."""

    rows: list  # dicts: step, heads_pruned, fraction_pruned, metric
    masks: list  # (L, N) float arrays, 0 = pruned
    metric: str

    def plan(self, step=-1):
        """`{layer: [heads]}` masked at `step`, for `prune_heads`."""
        n = len(self.masks)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not (
                -n <= step < n):
            raise ValueError(f"step {step!r} is out of range: the curve has {n} steps (0 to "
                             f"{n - 1}, or negative from the end).")
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
    removes them, and gives the model the curve measured. Layers sharing one attention sublayer
    (ALBERT) share their heads: a head is scored by the sum of its scores over those layers and
    masked in all of them at once, and `heads_pruned` counts distinct heads (weights removed).

    Returns:
        `PruningCurve` (`.rows`, `.masks`, `.plan(step)`, `.write(dir)` -> CSV + PNG).
    """
    backbone = backbone_of(task, "iterative_pruning")
    require_head_mask(backbone, "iterative_pruning")
    for name, value in (("target", target), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                              np.floating)):
            raise ValueError(f"{name} must be a number (a fraction of the heads), got "
                             f"{type(value).__name__} {value!r}.")
    if not 0 < target <= 1:
        raise ValueError(f"target must be a fraction of the heads in (0, 1], got {target!r}.")
    if not 0 < step <= target:
        raise ValueError(f"step must be in (0, target={target}], got {step!r}.")
    counts = heads_per_layer(backbone)
    _require_heads(counts, "iterative_pruning")
    groups = attention_groups(backbone)
    first = [members[0] for members in groups]  # a group's heads, as one row of the mask
    total = sum(counts[i] for i in first)
    per_step = max(1, int(round(step * total)))
    goal = int(round(target * total))
    if not goal:
        raise ValueError(f"target={target} of the {total} heads rounds to 0 heads: nothing to "
                         f"prune; give a target of at least {0.5 / total:.3g}.")
    batches = _batches(task, data, batch_size)
    score_batches = batches if importance_data is None else _batches(task, importance_data,
                                                                     batch_size)
    metric = _metric_name(task, batches[0])
    mask = full_mask(counts)
    rows, masks = [], []
    evaluate = _Evaluator(task, backbone, batches, metric, counts)

    def pruned_heads():
        return int(np.nansum(mask[first] == 0))

    def record(i):
        value = evaluate(mask)
        pruned = pruned_heads()
        rows.append({"step": i, "heads_pruned": pruned, "fraction_pruned": pruned / total,
                     metric: value})
        masks.append(mask.copy())
        if progress is not None:
            progress(rows[-1])

    record(0)
    i = 0
    while pruned_heads() < goal:
        i += 1
        layer_scores = normalize_importance(_importance(task, backbone, score_batches, mask,
                                                        counts))
        scores = np.stack([layer_scores[members].sum(0) for members in groups])  # (G, N)
        group_mask = mask[first]
        scores = np.where(np.isnan(group_mask) | (group_mask == 0), np.inf, scores)
        alive = np.nansum(group_mask, -1)
        n = min(per_step, goal - pruned_heads())
        chosen = 0
        for idx in np.argsort(scores, axis=None):
            if chosen == n or not np.isfinite(scores.flat[idx]):
                break
            group, head = divmod(int(idx), mask.shape[1])
            if alive[group] <= 1 and not allow_empty_layers:
                continue  # the last head of a layer stays
            mask[groups[group], head] = 0.0
            alive[group] -= 1
            chosen += 1
        if not chosen:
            break
        record(i)
    if pruned_heads() < goal:
        warn(
            f"iterative_pruning pruned {pruned_heads()} of the {goal} heads asked (target="
            f"{target}): every layer keeps one head; pass allow_empty_layers=True to prune "
            "further.")
    return PruningCurve(rows, masks, metric)
