"""Checks of model inputs given as arrays (NumPy, lists, concrete backend tensors), on the host
before a step: what a jitted JAX step (or XLA) cannot refuse and would compute silently.

Shared by a backbone's own entry points (`Backbone.predict`, an eager `backbone(x)`, ...) and
the tasks' (`kb.tasks.task`, which checks a dataset's ids and masks in its `tf.data` graph too),
and run on each batch of data Keras reads batch by batch (`checked_data`: a dataset, a
generator, a PyDataset, a torch DataLoader). Nothing here imports TensorFlow: a TensorFlow
tensor or dataset is recognised only where TensorFlow was imported already (nothing else can
make one).
"""
import sys
import types

import keras
import numpy as np

# The backbones' mask inputs, which hold 0 and 1 only, and what each value means: another value
# is refused naming the mask (`check_masks_in_memory`: a backbone's and a task's in-memory
# inputs, and each batch of a backbone's dataset or a stream, on every backend;
# `kb.tasks.task.check_ids`: a task's dataset's; a Longformer's own graph check,
# `check_mask_values`).
MASK_INPUTS = {"padding_mask": "1: a token, 0: padding",
               "global_attention_mask": "1: global attention on a token, 0: local"}
# HF's LongformerModel reads an attention_mask (our padding_mask) of 2 as a global token: said
# wherever a model with a global_attention_mask input refuses a padding_mask (`mask_expected`;
# a Longformer's graph check, `MASK_NOT_0_OR_1`).
GLOBAL_TOKEN_HINT = "HF's attention_mask of 2 (a global token) is global_attention_mask=1 here."


def mask_expected(key, global_attention=False):
    """How an error on the mask input `key` ends: the values it takes; a padding_mask of a
    model with global attention (`takes_global_attention`), with `GLOBAL_TOKEN_HINT`."""
    hint = " " + GLOBAL_TOKEN_HINT if global_attention and key == "padding_mask" else ""
    return f"expected 0 and 1 only ({MASK_INPUTS[key]})." + hint


def takes_global_attention(model):
    """Whether `model` (a backbone or a task) or its `backbone` takes a global_attention_mask
    (a Longformer's)."""
    for candidate in (model, getattr(model, "backbone", None)):
        names = getattr(candidate, "input", None) if isinstance(candidate, keras.Model) else None
        if isinstance(names, dict) and "global_attention_mask" in names:
            return True
    return False


def check_masks_in_memory(model, x):
    """In-memory model inputs `x` (a dict) of `model` (a backbone or a task): each mask
    (`MASK_INPUTS`) holds 0 and 1 only, else "<model's class> got <mask> <value> at
    <mask>[<position>]: expected 0 and 1 only (...)" (`mask_expected`), the first other value.
    A Longformer's TensorFlow graph refused them, but its jitted JAX step cannot raise (a
    padding_mask of 2, HF's global token, ran as a token; a global_attention_mask of -1, HF's
    padding, as global), and every family read a nonzero value as 1. The mask's minimum and
    maximum where it is (a float mask is looked at whole: 0.5 is in [0, 1]); the position only
    where a value is wrong. Symbolic tensors (a traced step) are not looked at."""
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
            raise ValueError(f"{type(model).__name__} got {key} {value} at {key}[{where}]: "
                             + mask_expected(key, takes_global_attention(model)))


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


def checked_data(data, check):
    """`data` that Keras reads batch by batch, with `check(x, y)` run on the host on each batch
    as it is read (x: the batch's dict of model inputs, as arrays; y: its labels, or None), a
    ValueError from it stopping the run: a `tf.data.Dataset` (`_checked_dataset`), a Python
    generator (`checked_batches`), a `keras.utils.PyDataset`, a torch `DataLoader`. A jitted
    JAX step (or XLA) cannot refuse values, so what it would compute silently is refused here,
    on every backend. Other data (in-memory inputs, checked where they are given; a dataset
    whose elements are no dict) is returned as it is."""
    tf = _tf()
    if tf is not None and isinstance(data, tf.data.Dataset):
        return _checked_dataset(data, check)
    if isinstance(data, types.GeneratorType):
        return checked_batches(data, check)
    if isinstance(data, keras.utils.PyDataset):
        return _CheckedPyDataset(data, check)
    if is_torch_data_loader(data):
        return _checked_data_loader(data, check)
    return data


def _checked_dataset(data, check):
    """A `tf.data.Dataset` of model inputs (a dict, alone or first of a tuple) mapped so that
    each batch's dense inputs go through `check(x, None)` on the host, as NumPy arrays (one
    `tf.numpy_function` a batch); a ValueError from it stops the pipeline with a
    `tf.debugging.Assert` of its message (a `tf.errors.InvalidArgumentError`, which a
    task's or backbone's entry point raises as a ValueError: `carry_tf_error`)."""
    tf = _tf()
    spec = data.element_spec
    features = spec[0] if isinstance(spec, tuple) else spec
    keys = [key for key, value in features.items() if isinstance(value, tf.TensorSpec)] if \
        isinstance(features, dict) else []
    if not keys:
        return data

    def refusal(*values):  # "" where check passes
        try:
            check(dict(zip(keys, values)), None)
        except ValueError as error:
            return str(error)
        return ""

    def checked(x):
        message = tf.numpy_function(refusal, [x[key] for key in keys], tf.string,
                                    stateful=False)
        with tf.control_dependencies([tf.debugging.Assert(tf.equal(message, ""), [message])]):
            return dict(x, **{key: tf.identity(x[key]) for key in keys})

    plain = tf.autograph.experimental.do_not_convert  # plain TF ops: no AutoGraph
    if isinstance(spec, tuple):
        return data.map(plain(lambda x, *rest: (checked(x), *rest)))
    return data.map(plain(checked))


def checked_batches(batches, check):
    """A Python generator's batches, each checked (`check_batch`) as Keras' generator adapter
    reads it, on every backend (on TensorFlow through `tf.data.Dataset.from_generator`). A
    generator again, which Keras takes as the one it wraps. (Also what a torch `DataLoader`'s
    batches are read through: `_checked_data_loader`.)"""
    for batch in batches:
        check_batch(batch, check)
        yield batch


def check_batch(batch, check):
    """One batch read from a stream (a Python generator, a PyDataset, a torch DataLoader):
    `(x,)`, `(x, y)` or `(x, y, sample_weight)` (a tuple or a list), or `x` alone, x a dict:
    `check(x, y)` (y None where there is none)."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], dict):
        check(batch[0], batch[1] if len(batch) > 1 else None)
    elif isinstance(batch, dict):
        check(batch, None)


class _CheckedPyDataset(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` whose batches are checked (`check_batch`) as Keras reads them,
    on every backend. Its length, workers, queue and epoch hooks are the wrapped one's."""

    def __init__(self, data, check):
        super().__init__(workers=data.workers, use_multiprocessing=data.use_multiprocessing,
                         max_queue_size=data.max_queue_size)
        self._data, self._check = data, check

    def __len__(self):
        return len(self._data)

    @property
    def num_batches(self):
        return self._data.num_batches

    def __getitem__(self, index):
        batch = self._data[index]
        check_batch(batch, self._check)
        return batch

    def on_epoch_begin(self):
        self._data.on_epoch_begin()

    def on_epoch_end(self):
        self._data.on_epoch_end()


def is_torch_data_loader(x):
    """A torch `DataLoader` (as Keras' data adapters recognise it: by class, torch not
    imported)."""
    return any(c.__name__ == "DataLoader" and c.__module__.startswith("torch.utils.data")
               for c in type(x).__mro__)


def is_batch_stream(x):
    """Model inputs that Keras reads batch by batch from Python: a generator, a PyDataset, a
    torch DataLoader."""
    return isinstance(x, (types.GeneratorType, keras.utils.PyDataset)) or \
        is_torch_data_loader(x)


def _checked_data_loader(loader, check):
    """A torch `DataLoader` whose batches are checked as Keras reads them (`checked_batches`),
    on every backend. A DataLoader again (Keras' torch loop iterates it as it is): the batches
    as the wrapped one makes them (its sampler, workers, collation), one a step, and its length
    where it has one. Its own random generator: opening it draws nothing from torch's global
    random state (the wrapped one's shuffling draws as it did)."""
    import torch

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            return checked_batches(loader, check)

    class SizedBatches(Batches):
        def __len__(self):
            return len(loader)

    sized = hasattr(loader.dataset, "__len__")  # as Keras' adapter asks
    return torch.utils.data.DataLoader(SizedBatches() if sized else Batches(), batch_size=None,
                                       collate_fn=_as_it_is, generator=torch.Generator())


def _as_it_is(batch):
    return batch
