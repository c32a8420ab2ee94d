"""The backbone base class and the one encoder body shared by the BERT-like families.

A family is a thin subclass of `EncoderBackbone`: it names its constructor arguments (keras-hub's
names) and fixes what makes it that family: an `embedding_dim` projection (ALBERT, ELECTRA), a
position offset (RoBERTa), no segment table and no pooler (DistilBERT), a sharing plan (ALBERT).
"""
import contextlib
import inspect
import os

import keras
import numpy as np
from keras import ops

from keras_bertfam import preset_hooks
from keras_bertfam.layers import TextEmbedding, TransformerStack
from keras_bertfam.layers.utils import TruncatedNormal, _check_positive, clone_initializer
from keras_bertfam.models.input_checks import _tf, check_masks_in_memory, checked_data
from keras_bertfam.models.weights_files import check_archive_store, checked_load, record

BACKBONE_INPUTS = ("token_ids", "segment_ids", "padding_mask")
# Inputs of the pretraining heads, which ride in the same dict as the backbone's.
HEAD_INPUTS = ("mask_positions", "span_starts", "span_ends", "perm_mask", "target_mapping")


def _outermost_call():
    """Whether a layer's `__call__` now is no other layer's inner call (Keras' call context)."""
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("current_call_ctx") is None


def bert_initializer(stddev=0.02):
    """BERT's `truncated_normal(0.02)` (`initializer_range` in HF configs)."""
    return TruncatedNormal(stddev=stddev)


def head_initializer(backbone):
    """A task's new heads: the backbone's `truncated_normal(initializer_range)`."""
    return bert_initializer(getattr(backbone, "initializer_range", 0.02))


def complete_inputs(model, inputs):
    """A backbone's or task's dict of inputs, matched to its inputs by name.

    keras-hub's inputs are enough: a missing `segment_ids` is all zeros and a missing
    `padding_mask` all ones (no padding); a Longformer's missing `global_attention_mask` is all
    zeros (no global token, HF's `global_attention_mask=None`); Python lists become int32 arrays. A backbone or head
    input the model does not take is dropped: RoBERTa's and DistilBERT's `segment_ids`, and the
    `mask_positions` that keras.io's "Getting Started with KerasHub" passes to a backbone along
    with its inputs. Any other key the model does not take (a typo) is an error: Keras would
    otherwise match the dict to the inputs by position, and a RoBERTa task given `segment_ids`,
    or keras-hub's own `BertBackbone` given the guide's `mask_positions`, reads the wrong
    tensors with only a warning."""
    if not isinstance(inputs, dict) or "token_ids" not in inputs:
        return inputs
    names = list(model.input) if isinstance(model.input, dict) else []
    known = set(names) | set(BACKBONE_INPUTS) | set(HEAD_INPUTS)
    unknown = sorted(set(inputs) - known)
    if names and unknown:
        raise ValueError(f"{type(model).__name__} got input(s) {unknown} it does not take; its "
                         f"inputs are {sorted(names)}.")
    out = {}
    for key, value in inputs.items():
        if names and key not in names:
            continue
        if isinstance(value, (list, tuple)):
            value = np.asarray(value, dtype="int32")
        out[key] = value
    token_ids = out["token_ids"]
    xp = np if isinstance(token_ids, np.ndarray) else ops
    if "segment_ids" in names and "segment_ids" not in out:
        out["segment_ids"] = xp.zeros_like(token_ids, dtype="int32")
    if "padding_mask" in names and "padding_mask" not in out:
        out["padding_mask"] = xp.ones_like(token_ids, dtype="int32")
    if "global_attention_mask" in names and "global_attention_mask" not in out:
        out["global_attention_mask"] = xp.zeros_like(token_ids, dtype="int32")  # HF's None
    return out


class KeepsVariablesOnError:
    """Mixin of a `keras.Model` (`Backbone`, `kb.tasks.Task`) whose data can fail in the middle
    of Keras' loop (a check of a dataset's batch, `checked_data`): on JAX its variables survive
    a failed fit / evaluate / predict (`evaluate` and `predict` run in
    `_variables_restored_on_error`)."""

    def _get_jax_state(self, **kwargs):
        """Keras' JAX loops take the variables' values out of the model (purging the variables)
        before their first step and put them back after the steps: `fit` in a `finally` from
        the last completed step's state, `evaluate` and `predict` only when the loop ends. An
        error at a first batch (a bad label in the pipeline), or anywhere in `evaluate` /
        `predict`, left every variable empty ("'NoneType' object is not callable" at any later
        use of the model). The values taken are kept where Keras' `jax_state_sync` restores
        from, until a completed step replaces them."""
        state = super()._get_jax_state(**kwargs)
        if kwargs.get("purge_model_variables"):
            parts = [name for name in ("trainable_variables", "non_trainable_variables",
                                       "optimizer_variables", "metrics_variables")
                     if kwargs.get(name)]
            self._jax_state = dict(zip(parts, state))
        return state

    @contextlib.contextmanager
    def _variables_restored_on_error(self):
        """`evaluate` / `predict`: on an error, the variables get their values back (JAX)."""
        try:
            yield
        except BaseException:
            if keras.backend.backend() == "jax":
                self.jax_state_sync()
                self._jax_state = None
            raise


class RematChecked:
    """Mixin of a `keras.Model` (`Backbone`, `kb.tasks.Task`) built in a `keras.RematScope`
    whose mode rematerializes whole layers ("full", "larger_than", "list_of_layers" naming
    its layers): a call Keras cannot run right is a clear error instead of Keras' own from
    deep inside the step, or wrong gradients. On JAX Keras wraps each layer's call in
    `jax.checkpoint`, which traces its Python arguments (`training`: every dropout's
    `if training` fails) and leaks the seed state the dropout advances; TensorFlow's
    `tf.recompute_grad` takes the `training` keyword only eagerly, and there draws every
    dropout's mask again for the gradient (the gradient of other masks than the forward
    pass's). Keras' own Dropout and Dense do the same (Keras 3.15). Torch runs it (its
    checkpoint restores the generator that unseeded dropout draws from), and
    `RematScope(mode="activations")` runs on every backend."""

    def rematerialized_call(self, layer_call, *args, **kwargs):
        remat = self._remat_mode
        mode = getattr(remat, "mode", None)
        whole = mode in ("full", "larger_than") or (mode == "list_of_layers" and set(
            remat.layer_names) & {layer.name for layer in self._flatten_layers()})
        backend = keras.backend.backend()
        why = _WHY_NO_REMAT.get(backend)
        if whole and why:
            raise ValueError(
                f"keras.RematScope(mode={mode!r}) rematerializes whole layers of this "
                f"{type(self).__name__}, which Keras {keras.__version__} cannot run on "
                f"{backend}: {why}. Use RematScope(mode='activations'), the torch backend, or "
                "build the model outside the scope.")
        return super().rematerialized_call(layer_call, *args, **kwargs)


# Why Keras' rematerialization of a whole layer fails on a backend (`RematChecked`).
_WHY_NO_REMAT = {
    "jax": "its jax.checkpoint of a layer's call traces the `training` flag (a dropout's "
           "`if training` fails) and leaks the seed state the dropout advances",
    "tensorflow": "its tf.recompute_grad takes the `training` keyword only eagerly (a compiled "
                  "step fails), and there draws the dropout masks again for the gradient",
}


class Backbone(RematChecked, KeepsVariablesOnError, keras.Model):
    """Base of every family's backbone: config round trip, presets, the tied token embedding.

    `get_config()` mirrors the constructor exactly: each argument of the subclass's `__init__` is
    stored as an attribute of the same name, and the config is read back from those attributes.
    """

    family = None  # e.g. "bert"; set by each family
    # TextClassifier's default hidden-layer activation (None: no hidden layer), set by a family
    # whose HF `*ForSequenceClassification` head has one, so that head converts.
    classifier_hidden_activation = None
    # Whether that HF head drops out before its hidden layer too (ELECTRA's does; DistilBERT's
    # pre_classifier and XLNet's sequence summary read the state as it is).
    classifier_dropout_first = True

    @classmethod
    def takes_segment_ids_in(cls, config):
        """Whether `cls.from_config(config)` takes a `segment_ids` input, read without building
        it (a preset's backbone: `presets.takes_segment_ids`): XLNet and Longformer do."""
        return True

    def __init__(self, *args, dtype=None, **kwargs):
        super().__init__(*args, **kwargs)
        # keras.Model's functional constructor drops `dtype`: set the policy the layers got.
        if dtype is not None:
            self.dtype_policy = keras.dtype_policies.get(dtype)

    def __setattr__(self, name, value):
        # torch.nn.Module refuses sublayers assigned before Model.__init__; the functional graph
        # tracks them anyway (keras-team/keras#18823).
        try:
            super().__setattr__(name, value)
        except AttributeError:
            object.__setattr__(self, name, value)

    # keras-hub's backbones take [CLS] (or `<s>`) from position 0 for the pooled output.
    cls_token_index = 0
    # Whether `backbone(inputs, cls_only=True)` and `backbone(inputs, positions=...)` run (see
    # `call`): a family whose output at [CLS] (or at given positions) can be computed alone in
    # the last layer. XLNet (its summary is the last token, its attention relative) and
    # Longformer (global attention) keep the full path.
    supports_cls_only = False

    @property
    def token_embedding(self):
        """The `keras.layers.Embedding` of token ids, for heads that tie their output to it."""
        return self.embeddings.token_embedding

    # keras-hub's backbones are flat: `get_layer("pooled_dense")` (keras.io's data-parallel
    # guide freezes it so), "token_embedding", "transformer_layer_0", ... Ours nest them
    # (`embeddings`, `encoder`, `pooler`) and expose them as attributes of keras-hub's names.
    KERAS_HUB_LAYER_NAMES = ("token_embedding", "position_embedding", "segment_embedding",
                             "embeddings_layer_norm", "embeddings_dropout", "pooled_dense")

    def get_layer(self, name=None, index=None):
        """`keras.Model.get_layer`, also by keras-hub's layer names (`KERAS_HUB_LAYER_NAMES`,
        `transformer_layer_{i}`) where this backbone has that layer."""
        try:
            return super().get_layer(name, index)
        except ValueError:
            layer = None
            if name in self.KERAS_HUB_LAYER_NAMES:
                layer = getattr(self, name, None)
            elif name and name.startswith(prefix := "transformer_layer_") and \
                    name[len(prefix):].isdigit():
                layers, index = getattr(self, "transformer_layers", []), int(name[len(prefix):])
                layer = layers[index] if index < len(layers) else None
            if isinstance(layer, keras.layers.Layer):
                return layer
            raise

    def __call__(self, inputs, *args, **kwargs):
        inputs = complete_inputs(self, inputs)
        if not getattr(self, "_inputs_checked", False) and _outermost_call():
            # A user's eager call (a task's graph calls its backbone inside its own call, with
            # inputs the task checked; a traced step's symbolic tensors are not looked at).
            check_masks_in_memory(self, inputs)
        return super().__call__(inputs, *args, **kwargs)

    # A backbone's own entry points check its inputs on the host as a task's do (JAX's jitted
    # step cannot raise: a Longformer's padding_mask of 2 ran silently there, a BERT's on every
    # backend): in memory now, a dataset's or a stream's batch by batch as Keras reads them.
    # The call of the step then does not check them again (torch's step calls the backbone
    # eagerly, batch by batch).
    def fit(self, x=None, *args, **kwargs):
        with self._checked_inputs(x, kwargs.get("validation_data")) as (x, validation):
            if validation is not None:
                kwargs["validation_data"] = validation
            return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        with self._checked_inputs(x) as (x,), self._variables_restored_on_error():
            return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        with self._checked_inputs(x) as (x,), self._variables_restored_on_error():
            return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        with self._checked_inputs(x) as (x,):
            return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        with self._checked_inputs(x) as (x,):
            return super().test_on_batch(x, *args, **kwargs)

    def predict_on_batch(self, x):
        with self._checked_inputs(x) as (x,):
            return super().predict_on_batch(x)

    @contextlib.contextmanager
    def _checked_inputs(self, *inputs):
        """Yields `inputs` (each None, in-memory inputs, `(x, y, ...)` validation data, or
        data Keras reads batch by batch) as the entry point passes them on: a dict (or a
        tuple's first) checked now (`check_masks_in_memory`), a dataset, generator, PyDataset
        or torch DataLoader batch by batch as it is read (`checked_data`). While the block
        runs, `__call__` checks nothing more when every one given was so checked (other data
        is checked where the step calls the backbone with its values, on torch); a
        TensorFlow error (a dataset's failed check) leaves as a task's does
        (`carry_tf_error`: a ValueError with the check's message)."""
        checked, passed = [], []
        for x in inputs:
            first = x[0] if isinstance(x, (tuple, list)) and x else x
            if isinstance(first, dict):
                check_masks_in_memory(self, first)
                checked.append(True)
                passed.append(x)
            else:
                passed.append(checked_data(x, lambda batch, y: check_masks_in_memory(self, batch)))
                checked.append(passed[-1] is not x)
        given = [done for x, done in zip(inputs, checked) if x is not None]
        before = getattr(self, "_inputs_checked", False)
        object.__setattr__(self, "_inputs_checked", before or (bool(given) and all(given)))
        try:
            yield tuple(passed)
        except Exception as error:
            tf = _tf()
            if tf is None or not isinstance(error, tf.errors.OpError):
                raise
            from keras_bertfam.preprocessing.errors import carry_tf_error

            carried = carry_tf_error(error)
            if carried is None:
                raise
            raise carried from None
        finally:
            object.__setattr__(self, "_inputs_checked", before)

    def call(self, inputs, training=None, mask=None, cls_only=False, positions=None, **kwargs):
        """The functional graph; with `cls_only=True` (a family with `supports_cls_only`),
        `_forward(..., cls_only=True)`: the last layer computes only the [CLS] row, and
        `sequence_output` is that row, (B, 1, H); `pooled_output` is unchanged. With
        `positions`, (B, P) int (the same families), `_forward(..., positions=positions)`: the
        last layer computes only those rows (and [CLS]'s when there is a pooler), and
        `sequence_output` is the full one's rows at `positions`, (B, P, H) (repeated positions
        repeat rows); `pooled_output` is unchanged.

        A task that reads only [CLS] calls `backbone(features, cls_only=True)` (an MLM,
        `backbone(features, positions=mask_positions)`): Keras records the keyword (and the
        positions tensor) in the task graph's node, so the backbone stays one layer of the task
        (the same weight paths) and every call of the task graph (fit, predict, JAX's
        `stateless_call`, export) replays it.
        """
        # JAX's fit / predict reach `call` through `stateless_call`, not `__call__`.
        # `training` is named in the signature: Keras passes it to `call` only then (it reads
        # the signature), and `Functional.call` hands it on to the layers; without it every
        # layer ran with its default, training=False (no dropout in fit).
        inputs = complete_inputs(self, inputs)
        if not cls_only and positions is None:
            return super().call(inputs, training=training, mask=mask, **kwargs)
        self._check_rows(cls_only, positions)
        inputs = {name: ops.convert_to_tensor(inputs[name], "int32") for name in self.input}
        if positions is not None:
            return self._forward(inputs, training=training, positions=positions)
        return self._forward(inputs, training=training, cls_only=True)

    def compute_output_spec(self, inputs, *args, cls_only=False, positions=None, **kwargs):
        spec = super().compute_output_spec(inputs, *args, **kwargs)
        if not cls_only and positions is None:
            return spec
        self._check_rows(cls_only, positions)
        sequence = spec["sequence_output"]  # (B, T, H) -> (B, 1, H), or (B, P, H)
        length = 1 if positions is None else positions.shape[1]
        rows = (sequence.shape[0], length, sequence.shape[2])
        return dict(spec, sequence_output=keras.KerasTensor(rows, dtype=sequence.dtype))

    def _check_rows(self, cls_only, positions):
        """`cls_only` / `positions`: one of them, on a family that `supports_cls_only`."""
        if cls_only and positions is not None:
            raise ValueError(f"{type(self).__name__}: give cls_only=True or positions, not both.")
        if positions is not None and len(positions.shape) != 2:
            raise ValueError(f"{type(self).__name__}: positions must be (batch, P) int, got "
                             f"shape {tuple(positions.shape)}.")
        if not self.supports_cls_only:
            given = "cls_only=True" if cls_only else "positions"
            raise ValueError(
                f"{type(self).__name__} has no [CLS]-only path (supports_cls_only=False): call "
                f"it without {given}.")

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable}
        params = inspect.signature(type(self).__init__).parameters
        for name, param in params.items():
            if name in ("self", "kwargs") or param.kind == param.VAR_KEYWORD:
                continue
            value = getattr(self, name)
            if name == "dtype":
                value = keras.dtype_policies.serialize(self.dtype_policy)
            config[name] = value
        if getattr(self, "heads_per_layer", None) is not None:
            config["heads_per_layer"] = list(self.heads_per_layer)  # kb.analysis.prune_heads
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    def save_weights(self, filepath, *args, **kwargs):
        """Keras' `save_weights`; a `.weights.h5` file records the settings that change what
        the weights compute and each tensor's digest too (`weights_files.record`)."""
        super().save_weights(filepath, *args, **kwargs)
        record(filepath, self)

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """Keras' `load_weights`; a file that does not fit the backbone (another family or
        size, a task's file, settings that change what the weights compute:
        `check_weights_file`) or whose bytes changed since it was saved (its tensors' digests, a
        `.keras` archive's CRC-32) is refused before anything is loaded, unless
        `skip_mismatch=True` (Keras' partial loading: none of these checks, digests included)."""
        with checked_load(self, filepath, skip_mismatch=skip_mismatch):
            return super().load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)

    def load_own_variables(self, store):
        """Keras' own; a `.keras` archive read on the fly has its weights' CRC-32 checked first
        (`weights_files.check_archive_store`)."""
        check_archive_store(store)
        super().load_own_variables(store)

    # === LoRA (keras-hub's `Backbone` API) ===
    def default_lora_layer_names(self):
        """The names of the layers `enable_lora()` adapts by default: each attention's query
        and value projections (ours are named "query" / "value"; keras-hub's "query_dense" /
        "value_dense" are kept so that target lists written for keras-hub work)."""
        return ["query_dense", "value_dense", "query", "value"]

    def _weighted_layers(self):
        """The backbone's layers that hold weights, in Keras' order (each shared layer once):
        the LoRA file's layer indices count these, as keras-hub's do."""
        return [layer for layer in self._flatten_layers(include_self=False) if layer.weights]

    def enable_lora(self, rank, target_layer_names=None):
        """Freezes every weight of the backbone and gives the layers named in
        `target_layer_names` (default `default_lora_layer_names()`) a trainable low-rank
        update of `rank` (LoRA, Hu et al. 2021; Keras' `EinsumDense.enable_lora`), as
        keras-hub's `Backbone.enable_lora`: the adapted layers' biases stay trainable, a task's
        own head stays trainable. Saving (`.keras`, `save_weights`, `save_to_preset`) writes
        the merged kernels; `save_lora_weights` writes the low-rank factors alone.

        >>> import keras_bertfam as kb
        >>> backbone = kb.models.BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2,
        ...                                   hidden_dim=8, intermediate_dim=16)
        >>> backbone.enable_lora(rank=2)
        >>> [w.path.split("/")[-2:] for w in backbone.trainable_weights][:3]
        [['query', 'bias'], ['query', 'lora_kernel_a'], ['query', 'lora_kernel_b']]
        """
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
            raise ValueError(f"enable_lora: rank must be a positive integer, got {rank!r}.")
        if target_layer_names is None:
            target_layer_names = self.default_lora_layer_names()
        if isinstance(target_layer_names, str) or not all(
                isinstance(name, str) for name in target_layer_names):
            raise ValueError(
                f"enable_lora: target_layer_names must be a list of layer names, got "
                f"{target_layer_names!r}.")
        if getattr(self, "_lora_enabled_layers", None):
            raise ValueError(
                f"enable_lora: LoRA is already enabled on this {type(self).__name__} (rank "
                f"{self._lora_rank}); it can be enabled once.")
        layers, targets = self._weighted_layers(), self._lora_targets(target_layer_names)
        self.trainable = True
        for layer in self._flatten_layers(include_self=False):
            layer.trainable = False
        for i in targets:
            layers[i].trainable = True
            layers[i].enable_lora(int(rank))
        self._lora_rank = int(rank)
        self._lora_enabled_layers = targets

    # Where a family's attention keeps its projections outside EinsumDense layers (XLNet).
    _lora_note = ""

    def _lora_targets(self, names):
        """The indices (in `_weighted_layers()`) of the layers named in `names` that take LoRA."""
        layers = self._weighted_layers()
        targets = [i for i, layer in enumerate(layers)
                   if layer.name in names and hasattr(layer, "enable_lora")]
        if not targets:
            adaptable = sorted({layer.name for layer in layers if hasattr(layer, "enable_lora")})
            raise ValueError(
                f"enable_lora: no layer of this {type(self).__name__} named one of "
                f"{list(names)} takes LoRA; its layers that do are named {adaptable}."
                + self._lora_note)
        return targets

    def save_lora_weights(self, filepath):
        """Writes the LoRA factors of `enable_lora()` to `filepath` (a name ending in
        `.lora.h5`, as keras-hub's), whole or not at all (written beside it, then renamed)."""
        import h5py

        if not getattr(self, "_lora_enabled_layers", None):
            raise ValueError(
                f"save_lora_weights: this {type(self).__name__} has no LoRA layers; call "
                f"`enable_lora(rank)` first.")
        filepath = os.path.expanduser(os.fspath(filepath))
        if not filepath.endswith(".lora.h5"):
            raise ValueError(
                f"save_lora_weights: the file name must end in `.lora.h5`, got {filepath!r}.")
        layers = self._weighted_layers()
        partial = f"{filepath}.partial-{os.getpid()}"
        try:
            with h5py.File(partial, "w") as f:
                group = f.create_group("lora")
                group.attrs["rank"] = self._lora_rank
                group.attrs["backbone"] = type(self).__name__
                for i in self._lora_enabled_layers:
                    layer = layers[i]
                    inner = group.create_group(str(i))
                    inner.attrs["path"] = layer.path
                    for name in ("lora_kernel_a", "lora_kernel_b"):
                        inner[name] = keras.ops.convert_to_numpy(getattr(layer, name))
            os.replace(partial, filepath)
        finally:
            if os.path.exists(partial):
                os.remove(partial)

    def load_lora_weights(self, filepath):
        """Reads a `save_lora_weights` file: checks that its rank, layers, shapes and values
        (finite) fit this backbone, then enables LoRA at its rank if it is not enabled (on the
        default layers) and assigns the factors. A file that does not fit changes nothing."""
        import h5py

        filepath = os.path.expanduser(os.fspath(filepath))
        try:
            f = h5py.File(filepath, "r")
        except (OSError, ValueError) as e:
            raise ValueError(
                f"load_lora_weights: {filepath!r} is not a readable LoRA file "
                f"(save_lora_weights writes them): {e}") from None
        with f:
            group = f.get("lora")
            rank = None if group is None else group.attrs.get("rank")
            if rank is None:
                raise ValueError(
                    f"load_lora_weights: {filepath!r} holds no LoRA weights (no 'lora' group "
                    f"with a rank; save_lora_weights writes them).")
            rank, enabled = int(rank), getattr(self, "_lora_enabled_layers", None)
            if enabled and self._lora_rank != rank:
                raise ValueError(
                    f"load_lora_weights: {filepath!r} holds rank-{rank} LoRA weights, but this "
                    f"backbone was given `enable_lora(rank={self._lora_rank})`. Both ranks "
                    f"must match.")
            targets = enabled or self._lora_targets(self.default_lora_layer_names())
            if sorted(group.keys(), key=int) != [str(i) for i in targets]:
                raise ValueError(
                    f"load_lora_weights: {filepath!r} holds LoRA weights for layers "
                    f"{sorted(map(int, group.keys()))}, this backbone's LoRA layers are "
                    f"{targets} (another architecture or other target layers).")
            layers, values = self._weighted_layers(), {}
            for i in targets:
                kernel = tuple(layers[i].kernel.shape)
                expected = {"lora_kernel_a": kernel[:-1] + (rank,),
                            "lora_kernel_b": (rank, kernel[-1])}
                for name, shape in expected.items():
                    value = group[str(i)].get(name)
                    value = None if value is None else np.asarray(value)
                    if value is None or value.shape != shape:
                        raise ValueError(
                            f"load_lora_weights: {filepath!r}: layer {i} ({layers[i].path}) "
                            f"{name} has shape {None if value is None else value.shape}, "
                            f"expected {shape}.")
                    if not np.isfinite(value).all():
                        raise ValueError(
                            f"load_lora_weights: {filepath!r}: layer {i} ({layers[i].path}) "
                            f"{name} holds non-finite values (a damaged file?).")
                    values[i, name] = value
        if not enabled:
            self.enable_lora(rank)
        for (i, name), value in values.items():
            getattr(layers[i], name).assign(value)

    # === Presets ===
    @classmethod
    def from_preset(cls, preset, load_weights=True, **overrides):
        """A backbone from a registered name, one of our preset dirs, or an HF-format dir."""
        return preset_hooks.call("load_backbone", preset, cls=cls, load_weights=load_weights,
                                 **overrides)

    def save_to_preset(self, preset_dir):
        preset_hooks.call("save_backbone", self, preset_dir)


class EncoderBackbone(Backbone):
    """Embeddings -> transformer encoder -> optional tanh pooler over [CLS].

    Inputs: `{"token_ids", "segment_ids", "padding_mask"}` (no `segment_ids` when
    `num_segments=0` or the family has no segments, as RoBERTa), each (B, T) int; a missing
    `segment_ids` is zeros and a missing `padding_mask` ones, as keras-hub's inputs allow. Outputs: `{"sequence_output": (B, T, H),
    "pooled_output": (B, H)}` (no `pooled_output` when `pooler=False`).

    `backbone(inputs, cls_only=True)` computes the last layer at [CLS] only (its queries,
    attention output, LayerNorms and feed-forward; keys and values from every position):
    `sequence_output` is then the [CLS] row (B, 1, H), and it and `pooled_output` equal the
    full path's. `TextClassifier` and `MultipleChoice` run this way. `backbone(inputs,
    positions=p)`, p (B, P) int, likewise computes the last layer at those positions only (and at
    [CLS], for the pooler): `sequence_output` is the full one's rows at p, (B, P, H), and
    `pooled_output` the full one. `MaskedLM` and the BERT / ALBERT pretrainers run this way.

    Every family takes `heads_per_layer=[n_0, ..., n_{L-1}]` as a keyword: layer i keeps n_i heads
    of width `hidden_dim // num_heads` (a structurally pruned model, `kb.analysis.prune_heads`;
    recorded in the config, so presets save and reload it).
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        embedding_dim=None,
        dropout=0.1,
        attention_dropout=None,
        max_sequence_length=512,
        num_segments=2,
        position_offset=0,
        num_groups=None,
        share="none",
        num_inner_repetitions=1,
        pooler=True,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        dtype=None,
        heads_per_layer=None,
        **kwargs,
    ):
        _check_positive(
            vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=num_heads,
            hidden_dim=hidden_dim, intermediate_dim=intermediate_dim,
            max_sequence_length=max_sequence_length,
        )
        embedding_dim = embedding_dim or hidden_dim
        initializer = bert_initializer(initializer_range)

        # === Layers ===
        self.embeddings = TextEmbedding(
            vocabulary_size,
            max_sequence_length,
            embedding_dim,
            hidden_dim=hidden_dim,
            num_segments=num_segments,
            position_offset=position_offset,
            layer_norm_epsilon=layer_norm_epsilon,
            dropout=dropout,
            kernel_initializer=initializer,
            dtype=dtype,
            name="embeddings",
        )
        self.encoder = TransformerStack(
            num_layers,
            hidden_dim,
            num_heads,
            intermediate_dim,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            dropout=dropout,
            attention_dropout=attention_dropout,
            kernel_initializer=initializer,
            num_groups=num_groups,
            share=share,
            heads_per_layer=heads_per_layer,
            num_inner_repetitions=num_inner_repetitions,
            dtype=dtype,
            name="encoder",
        )
        self.pooler_dense = (
            keras.layers.Dense(
                hidden_dim,
                activation="tanh",
                kernel_initializer=clone_initializer(initializer),
                dtype=dtype,
                name="pooler",
            )
            if pooler
            else None
        )

        # === Functional model ===
        inputs = {
            "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input(shape=(None,), dtype="int32", name="padding_mask"),
        }
        if num_segments and self.takes_segment_ids:
            inputs["segment_ids"] = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        outputs = self._forward(inputs)
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.embedding_dim = embedding_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.position_offset = position_offset
        self.num_groups = num_groups
        self.share = share
        self.num_inner_repetitions = num_inner_repetitions
        self.pooler = pooler
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.heads_per_layer = self.encoder.heads_per_layer

    takes_segment_ids = True  # RoBERTa, DistilBERT: False (no `segment_ids` input)

    @classmethod
    def takes_segment_ids_in(cls, config):
        # as the functional model's inputs are made: `num_segments and takes_segment_ids`
        parameter = inspect.signature(cls.__init__).parameters.get("num_segments")
        segments = config.get("num_segments", getattr(parameter, "default", None))
        return bool(cls.takes_segment_ids and segments)

    supports_cls_only = True

    # === keras-hub's attribute names ===
    @property
    def position_embedding(self):
        return self.embeddings.position_embedding

    @property
    def segment_embedding(self):
        return self.embeddings.segment_embedding

    @property
    def embeddings_layer_norm(self):
        return self.embeddings.layer_norm

    @property
    def embeddings_dropout(self):
        return self.embeddings.dropout_layer

    @property
    def transformer_layers(self):
        """The block each layer runs, in order (shared blocks repeat)."""
        return [block for i in range(self.num_layers) for block in self.encoder.layer_blocks(i)]

    @property
    def pooled_dense(self):
        return self.pooler_dense

    def _forward(self, inputs, head_mask=None, return_all=False, training=None, cls_only=False,
                 positions=None):
        cls = self.cls_token_index
        rows = slice(cls, cls + 1) if cls_only else None
        with_cls = positions is not None and self.pooler_dense is not None
        if positions is not None:
            rows = ops.cast(positions, "int32")
            if with_cls:  # the pooler reads [CLS]: its row first
                rows = ops.concatenate([ops.full_like(rows[:, :1], cls), rows], axis=1)
        x = self.embeddings(inputs["token_ids"], inputs.get("segment_ids"), training=training)
        x = self.encoder(
            x,
            padding_mask=inputs["padding_mask"],
            head_mask=head_mask,
            return_all=return_all,
            training=training,
            last_layer_rows=rows,
        )  # (B, T, H); the [CLS] row (B, 1, H) with cls_only; with positions, (B, [1 +] P, H)
        outputs = {}
        if return_all:
            x, states, probs = x
            # One entry per layer: with `num_inner_repetitions=R` (ALBERT) the stack returns one
            # per block call; keep each layer's output (after its last inner block) and the
            # attention of its last inner block.
            repeats = getattr(self.encoder, "num_inner_repetitions", 1) or 1
            outputs["hidden_states"] = [states[0]] + list(states[repeats::repeats])
            outputs["attention_probs"] = list(probs[repeats - 1::repeats])
        outputs["sequence_output"] = x[:, 1:] if with_cls else x
        if self.pooler_dense is not None:
            outputs["pooled_output"] = self.pooler_dense(x[:, cls if rows is None else 0, :])
        return outputs

    def inspect(self, inputs, head_mask=None):
        """Forward pass that also returns every layer's hidden states and attention probabilities.

        For probing and head pruning (`head_mask`: (L, N) or (L, B, N) multipliers, 0 removes a
        head; a list of per-layer masks when `heads_per_layer` differ). Returns the backbone
        outputs plus `hidden_states` (L+1 tensors: the embedding output, then each layer's) and
        `attention_probs` (L tensors, (B, N, T, T)). With `num_inner_repetitions=R` (ALBERT) a
        layer runs R blocks: its hidden state is its output (after the last inner block) and its
        attention map that of its last inner block.
        """
        inputs = {k: ops.convert_to_tensor(v) for k, v in inputs.items() if k in self.input}
        return self._forward(inputs, head_mask=head_mask, return_all=True, training=False)

    def num_params(self):
        """Distinct parameters (shared weights counted once)."""
        return int(sum(int(ops.size(w)) for w in _unique(self.weights)))


def _unique(variables):
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out
