"""Checks of model inputs given as arrays (NumPy, lists, concrete backend tensors), on the host
before a step: what a jitted JAX step (or XLA) cannot refuse and would compute silently.

Shared by a backbone's own entry points (`Backbone.predict`, an eager `backbone(x)`, ...) and
the tasks' (`kb.tasks.task`, which checks a dataset's inputs in its `tf.data` graph too).
Nothing here imports TensorFlow: a TensorFlow tensor or dataset is recognised only where
TensorFlow was imported already (nothing else can make one).
"""
import sys

import keras
import numpy as np

# The backbones' mask inputs, which hold 0 and 1 only, and what each value means: another value
# is refused naming the mask (`check_masks_in_memory`: a backbone's and a task's in-memory
# inputs, on every backend; `kb.tasks.task.check_ids`: a dataset's; a Longformer's own graph
# check, `check_mask_values`).
MASK_INPUTS = {"padding_mask": "1: a token, 0: padding",
               "global_attention_mask": "1: global attention on a token, 0: local"}


def mask_expected(key):
    """How an error on the mask input `key` ends: the values it takes."""
    return f"expected 0 and 1 only ({MASK_INPUTS[key]})."


def check_masks_in_memory(name, x):
    """In-memory model inputs `x` (a dict) of the model `name`: each mask (`MASK_INPUTS`) holds 0
    and 1 only, else "<name> got <mask> <value> at <mask>[<position>]: expected 0 and 1 only
    (...)", the first other value. A Longformer's TensorFlow graph refused them, but its jitted
    JAX step cannot raise (a padding_mask of 2, HF's global token, ran as a token; a
    global_attention_mask of -1, HF's padding, as global), and every family read a nonzero
    value as 1. The mask's minimum and maximum where it is (a float mask is looked at whole:
    0.5 is in [0, 1]); the position only where a value is wrong. Symbolic tensors (a traced
    step) are not looked at."""
    if not isinstance(x, dict):
        return
    for key in MASK_INPUTS:
        mask, kind = numbers_in_memory(x.get(key))
        if mask is None:  # (a bool mask holds 0 and 1)
            continue
        low, high = min_max(mask)
        if low is None or (low >= 0 and high <= 1 and kind != "f"):  # (NaN: looked at)
            continue
        found = first_wrong(mask, lambda v: (v != 0) & (v != 1))
        if found is not None:
            value, where = found
            raise ValueError(f"{name} got {key} {value} at {key}[{where}]: "
                             + mask_expected(key))


def _tf():
    """TensorFlow where it is imported (a TensorFlow tensor or dataset exists only then)."""
    return sys.modules.get("tensorflow")


def numbers_in_memory(values):
    """-> (`values`, lists as an array; their dtype's kind: "i", "u" or "f"), or (None, None)
    for what is checked elsewhere or not at all: nothing, a dataset, a symbolic input, a
    string, ragged lists (Keras' own error names them), another dtype (bool, strings), an empty
    array."""
    tf = _tf()
    if values is None or isinstance(values, (str, bytes, keras.KerasTensor)) or (
            tf is not None and isinstance(values, tf.data.Dataset)):
        return None, None
    if isinstance(values, (list, tuple)):
        try:
            values = np.asarray(values)
        except ValueError:
            return None, None
    try:
        kind = np.dtype(keras.backend.standardize_dtype(getattr(values, "dtype", None))).kind
    except (TypeError, ValueError):
        return None, None
    if kind not in "iuf" or 0 in tuple(getattr(values, "shape", (0,))):
        return None, None
    return values, kind


def min_max(values):
    """(min, max) of an array or tensor as Python numbers, computed where the values are; (None,
    None) for what is not an in-memory array (a symbolic tensor: checked where it is read)."""
    try:
        if isinstance(values, np.ndarray):
            return values.min().item(), values.max().item()
        tf = _tf()
        if tf is not None and isinstance(values, (tf.Tensor, tf.Variable)):
            if not tf.executing_eagerly() or not hasattr(values, "numpy"):
                return None, None
            return (tf.reduce_min(values).numpy().item(), tf.reduce_max(values).numpy().item())
        if keras.ops.is_tensor(values):  # the backend's own (a JAX array, a torch tensor)
            return (keras.ops.convert_to_numpy(keras.ops.min(values)).item(),
                    keras.ops.convert_to_numpy(keras.ops.max(values)).item())
        values = np.asarray(values)  # another array type (e.g. a pandas frame): NumPy's
        return values.min().item(), values.max().item()
    except Exception:  # noqa: BLE001 - not an in-memory array: checked where it is read
        return None, None


def first_wrong(values, wrong):
    """In-memory `values` -> (the first value where `wrong(values as a NumPy array)` holds, as a
    Python number; its position, as "i, j"), or None where there is none."""
    values = values if isinstance(values, np.ndarray) else np.asarray(
        keras.ops.convert_to_numpy(values))
    found = np.argwhere(wrong(values))
    if not len(found):
        return None
    index = tuple(int(i) for i in found[0])
    return values[index].item(), ", ".join(map(str, index))
