"""XLNet pretraining: the permutation-LM loss on the query stream (Yang et al. 2019).

Segment recurrence under `fit()`: with `memory_batch_size`, the task keeps the previous batch's
memory in a non-trainable variable of shape (L, B, mem_len, H) (zeros at first, as the original
`train_gpu.py`). Each forward pass reads it, feeds it to the backbone as `mems`, and writes the
new memory (stop-gradient) back with `Variable.assign` inside the graph, the mechanism Keras uses
for BatchNormalization's moving statistics: it runs under `fit()` on TensorFlow (tf.function),
JAX (the stateless train step returns the updated non-trainable state) and PyTorch. Row b of
batch s + 1 must continue row b of batch s (`XLNetPreprocessor` makes such batches: B parallel
streams), the batch size must stay `memory_batch_size` (drop the remainder), and the data must
not be shuffled. `reset_memory()` zeroes it (e.g. between epochs or documents streams).
"""
import keras
import numpy as np
from keras import ops

from keras_bertfam.models.input_checks import first_wrong, min_max, numbers_in_memory
from keras_bertfam.tasks.losses import weight_sum, weighted_sparse_ce
from keras_bertfam.tasks.masked_lm import (
    mask_id_table,
    serving_mask_positions,
    serving_mlm_outputs,
)
from keras_bertfam.tasks.task import Task


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SegmentMemory(keras.layers.Layer):
    """The memory of the previous segment as a non-trainable (L, B, M, H) variable.

    `memory(x)` reads it (a list of L (B, M, H) tensors; x only orders the graph);
    `memory(x, new_mems)` writes `new_mems` and returns x unchanged.
    """

    def __init__(self, num_layers, batch_size, mem_len, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_layers, self.batch_size = num_layers, batch_size
        self.mem_len, self.hidden_dim = mem_len, hidden_dim
        self.memory = self.add_weight(
            name="memory", shape=(num_layers, batch_size, mem_len, hidden_dim),
            initializer="zeros", trainable=False)
        self.built = True

    def call(self, x, new_mems=None):
        if new_mems is None:
            value = ops.cast(self.memory, self.compute_dtype)
            return [value[i] for i in range(self.num_layers)]
        self.memory.assign(ops.cast(ops.stack(new_mems, axis=0), self.memory.dtype))
        return x

    def compute_output_spec(self, x, new_mems=None):
        if new_mems is None:
            return [keras.KerasTensor((self.batch_size, self.mem_len, self.hidden_dim),
                                      dtype=self.compute_dtype)
                    for _ in range(self.num_layers)]
        return keras.KerasTensor(x.shape, dtype=x.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, batch_size=self.batch_size,
                      mem_len=self.mem_len, hidden_dim=self.hidden_dim)
        return config


@keras.saving.register_keras_serializable(package="keras_bertfam")
class XLNetPretrainer(Task):
    """XLNet backbone + permutation-LM head tied to the token embedding.

    Inputs: `token_ids`, `segment_ids`, `padding_mask` (B, T) int, `perm_mask` (B, T, T) float
    (1 = cannot attend), `target_mapping` (B, P, T) float one-hot. Output: logits (B, P, V) =
    query stream · E^T + b (the original `lm_loss`, HF `XLNetLMHeadModel.lm_loss`). Labels: y =
    `target` (B, P) ids with `sample_weight = target_mask` (B, P). Loss: Σ w·CE / Σ w.

    Export (`kb.export.export_saved_model`): `text` with mask tokens (`<mask>`) -> top-k
    predictions at them, as HF's `XLNetLMHeadModel` is used to fill masks: the text is packed
    `A <sep> <cls>` with left padding, `perm_mask` hides every mask token's content from all
    positions, `target_mapping` points the query stream at the mask tokens (masks first, in order),
    and the memory is not used. Outputs as `MaskedLM`'s: `mask_positions`, `mask_weights`,
    `mlm_top_ids`, `mlm_top_probabilities` (B, T, k); slots with weight 0 are not masks.

    Args:
        backbone: an `XLNetBackbone`.
        preprocessor: an `XLNetPreprocessor` for `fit()` on raw text, or None.
        memory_batch_size: carry the memory across consecutive batches (segment recurrence);
            needs `backbone.mem_len`. None: no memory.

    Example:
    >>> backbone = kb.models.XLNetBackbone(100, 2, 2, 16, 32)  # doctest: +SKIP
    >>> task = kb.tasks.XLNetPretrainer(backbone)              # doctest: +SKIP
    """

    serving_reads_mask_tokens = True

    uses_pooled_output = False  # the pooler is not trained by this task

    preprocessor_args = ("sequence_length", "batch_size", "seed", "reuse_len", "num_predict",
                         "window_steps")
    backbone_families = ("xlnet",)

    def __init__(self, backbone, preprocessor=None, memory_batch_size=None, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.memory_batch_size = memory_batch_size
        if memory_batch_size and not backbone.mem_len:
            raise ValueError("Segment recurrence needs a backbone with mem_len > 0.")
        int_input = lambda name: keras.Input(shape=(None,), dtype="int32", name=name)
        inputs = {name: int_input(name) for name in ("token_ids", "segment_ids", "padding_mask")}
        inputs["perm_mask"] = keras.Input(shape=(None, None), dtype="float32", name="perm_mask")
        inputs["target_mapping"] = keras.Input(shape=(None, None), dtype="float32",
                                               name="target_mapping")
        self.memory = None
        mems = None
        if memory_batch_size:
            self.memory = SegmentMemory(backbone.num_layers, memory_batch_size, backbone.mem_len,
                                        backbone.hidden_dim, name="segment_memory")
            mems = self.memory(inputs["token_ids"])
        out = backbone.forward(inputs, mems=mems, return_mems=mems is not None)
        self.lm_head = LMBias(backbone.token_embedding, name="lm_head")
        logits = self.lm_head(out["query_output"])
        if mems is not None:
            logits = self.memory(logits, out["mems"])
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._track_losses(["plm_loss", "plm_accuracy"])

    def reset_memory(self):
        if self.memory is not None:
            self.memory.memory.assign(ops.zeros(self.memory.memory.shape, self.memory.memory.dtype))

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, batch_size=32,
                             seed=None, **kwargs):
        """`XLNetPreprocessor`: B parallel streams, `reuse_len` the backbone's (else T // 2)."""
        from keras_bertfam.preprocessing.permutation import XLNetPreprocessor

        kwargs.pop("masker", None)
        kwargs.setdefault("reuse_len", backbone.reuse_len or sequence_length // 2)
        return XLNetPreprocessor(tokenizer, sequence_length=sequence_length,
                                 batch_size=batch_size, seed=seed, **kwargs)

    @classmethod
    def pretraining_task(cls, backbone, preprocessor):
        """Segment recurrence when the backbone keeps a memory (`mem_len`): the preprocessor's
        rows are parallel streams, one per batch row."""
        memory = preprocessor.batch_size if (backbone.mem_len and preprocessor is not None) else None
        return cls(backbone=backbone, preprocessor=preprocessor, memory_batch_size=memory)

    packing_layout = "xlnet"  # serving: xlnet_pack, `... A <sep> <cls>` ends the row

    def serving_features(self, features, special_token_ids):
        features = serving_mask_positions(features, special_token_ids["mask"])
        is_mask = ops.cast(ops.equal(features["token_ids"], special_token_ids["mask"]), "float32")
        length = ops.shape(is_mask)[1]
        # no position sees a mask token's content; the query stream predicts every slot
        perm_mask = ops.broadcast_to(is_mask[:, None, :], (ops.shape(is_mask)[0], length, length))
        target_mapping = ops.one_hot(features["mask_positions"], length, dtype="float32")
        return dict(features, perm_mask=perm_mask, target_mapping=target_mapping)

    def serving_call(self, inputs):
        # The backbone without the training memory (its batch size is fixed by fit).
        names = ("token_ids", "segment_ids", "padding_mask", "perm_mask", "target_mapping")
        out = self.backbone.forward({k: inputs[k] for k in names}, training=False)
        return self.lm_head(out["query_output"])

    def serving_outputs(self, features, outputs):
        return serving_mlm_outputs(features, outputs)

    def check_head_inputs(self, x):
        """`perm_mask` and `target_mapping` given as model inputs (`check_permutation_inputs`)."""
        check_permutation_inputs(type(self).__name__, x)

    def label_id_tables(self):
        """Labels checked before training (preprocessor=None: `target`, the ids at the
        predicted positions, in the vocabulary)."""
        return [("target",) + mask_id_table(self)[1:]]

    def metric_weights(self, y, y_pred, sample_weight):
        if isinstance(y, dict):
            y, sample_weight = y["target"], y.get("target_mask", sample_weight)
        n = weight_sum(y, sample_weight)
        return {"plm_loss": n, "plm_accuracy": n}

    def losses_and_metrics(self, y, y_pred, sample_weight):
        if isinstance(y, dict):
            y, sample_weight = y["target"], y.get("target_mask", sample_weight)
        loss, accuracy = weighted_sparse_ce(y, y_pred, sample_weight)
        return loss, {"plm_loss": loss, "plm_accuracy": accuracy}


PERM_MASK_EXPECTED = ("expected 0 (i may attend to j) or a positive value (i may not: HF's XLNet "
                      "reads perm_mask > 0 as 1).")
TARGET_MAPPING_EXPECTED = "(target_mapping[b, p, j] = 1: slot p predicts the token at j)."
# What each input's shape must be, from token_ids' (batch, length), and its axes' names.
_LAYOUTS = {"perm_mask": "(batch, length, length)",
            "target_mapping": "(batch, num_predict, length)"}


def check_permutation_inputs(name, x):
    """In-memory `perm_mask` and `target_mapping` of the model `name` (preprocessor=None), where
    HF's XLNetLMHeadModel computes otherwise or the permutation LM means nothing; a ValueError
    naming the input, the first wrong value and its position (or both shapes), else nothing.

    - Shapes: perm_mask (batch, length, length), target_mapping (batch, num_predict, length), of
      token_ids' (batch, length): another batch size or a length of 1 broadcast silently.
    - perm_mask >= 0: HF blocks i -> j where `(1 - padding_mask) + perm_mask > 0`, ours where
      either is nonzero: the same for every value >= 0 (2 and 0.5 block as 1 does), but a
      negative one (or NaN) is attended in HF's and blocked in ours.
    - target_mapping: 0 and 1 only, each row one-hot (the position its slot predicts) or all 0
      (a padding slot), as HF documents it. Both models compute the same for any values (a
      slot's query is put at, and its output read from, the row's weighted sum of positions),
      but a 2 or a 0.5 scales the slot's query and output and a second 1 sums two positions:
      the logits are then no prediction of a token, and a loss trains on them silently.

    One min (perm_mask) and one pass over target_mapping (B, P, T) a batch, on the host."""
    ids_shape = _static_shape(x.get("token_ids"))
    if ids_shape is None or len(ids_shape) != 2:
        return
    batch, length = ids_shape
    for key, layout in _LAYOUTS.items():
        shape = _static_shape(x.get(key))
        if shape is None:
            continue
        middle = length if key == "perm_mask" else shape[1] if len(shape) == 3 else "num_predict"
        expected = (batch, middle, length)
        if tuple(shape) != expected:
            raise ValueError(f"{name} got {key} of shape {tuple(shape)} for token_ids of shape "
                             f"{tuple(ids_shape)}: expected ({batch}, {middle}, {length}) "
                             f"{layout}.")
    perm_mask, _ = numbers_in_memory(x.get("perm_mask"))
    if perm_mask is not None:
        low, _ = min_max(perm_mask)
        if low is not None and not low >= 0:  # (NaN: not >= 0)
            found = first_wrong(perm_mask, lambda v: ~(v >= 0))
            if found is not None:
                value, where = found
                raise ValueError(f"{name} got perm_mask {value} at perm_mask[{where}]: "
                                 + PERM_MASK_EXPECTED)
    mapping, _ = numbers_in_memory(x.get("target_mapping"))
    if mapping is None:
        return
    mapping = mapping if isinstance(mapping, np.ndarray) else np.asarray(
        keras.ops.convert_to_numpy(mapping))
    found = first_wrong(mapping, lambda v: (v != 0) & (v != 1))
    if found is not None:
        value, where = found
        raise ValueError(f"{name} got target_mapping {value} at target_mapping[{where}]: "
                         "expected 0 and 1 only " + TARGET_MAPPING_EXPECTED)
    several = np.argwhere(mapping.sum(axis=-1) > 1)
    if len(several):
        b, p = (int(i) for i in several[0])
        first, second = (int(j) for j in np.flatnonzero(mapping[b, p])[:2])
        raise ValueError(
            f"{name} got target_mapping {mapping[b, p, second].item()} at target_mapping[{b}, "
            f"{p}, {second}] after a 1 at target_mapping[{b}, {p}, {first}]: expected each row "
            "one-hot (the position its slot predicts) or all 0 (a padding slot) "
            + TARGET_MAPPING_EXPECTED)


def _static_shape(values):
    """The shape of in-memory values (lists: NumPy's), or None: nothing, ragged lists, a shape
    with an unknown axis (symbolic: not checked here)."""
    if values is None or isinstance(values, (str, bytes)):
        return None
    try:
        shape = tuple(np.shape(values)) if isinstance(values, (list, tuple)) else tuple(
            values.shape)
    except (AttributeError, TypeError, ValueError):
        return None
    if any(not isinstance(d, (int, np.integer)) for d in shape):
        return None
    return tuple(int(d) for d in shape)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class LMBias(keras.layers.Layer):
    """`x @ E^T + b`: logits against the tied token table (the backbone's Embedding, referenced,
    not copied) plus a vocabulary bias."""

    def __init__(self, token_embedding, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.vocabulary_size = token_embedding.input_dim

    def build(self, x_shape):
        self.bias = self.add_weight(name="bias", shape=(self.vocabulary_size,),
                                    initializer="zeros")
        self.built = True

    def call(self, x):
        table = ops.cast(self.token_embedding.embeddings, x.dtype)  # (V, H)
        return ops.matmul(x, ops.transpose(table)) + ops.cast(self.bias, x.dtype)  # (B, P, V)

    def compute_output_shape(self, x_shape):
        return tuple(x_shape[:-1]) + (self.vocabulary_size,)

    def get_config(self):
        raise NotImplementedError("LMBias is serialized by the task that owns it.")
