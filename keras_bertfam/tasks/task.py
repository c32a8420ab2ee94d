"""The task base class: a functional keras.Model with an optional preprocessor and its loss.

A task owns its loss in `compute_loss`, so `fit()` trains it on TensorFlow, JAX and PyTorch with
no extra framework. When a preprocessor is attached, `fit` / `evaluate` / `predict` take raw
strings (lists, arrays or a `tf.data.Dataset`) and map the preprocessor in `tf.data`; without one
they take the model's own inputs (keras-hub's preprocessed format for pretraining tasks).
"""
import contextlib
import inspect
import json
import os
import re
import types
import warnings

import keras
import keras_hub
import numpy as np
import tensorflow as tf
from keras import ops, tree

from keras_bertfam import preset_hooks
from keras_bertfam.models.backbone import KeepsVariablesOnError, RematChecked, complete_inputs
from keras_bertfam.models.input_checks import (
    MASK_INPUTS,
    check_masks_in_memory,
    checked_data,
    first_wrong,
    is_batch_stream,
    mask_expected,
    min_max,
    numbers_in_memory,
    takes_global_attention,
)
from keras_bertfam.models.weights_files import (OPTIMIZER_RECORD, check_archive_store,
                                                 check_optimizer_store, checked_load, record,
                                                 save_optimizer_record)
from keras_bertfam.preprocessing.finetuning import (FinetuningPreprocessor, ReturnsModelInputs,
                                                    TextClassifierPreprocessor, _assert_then,
                                                    any_batch_size, check_fits_positions,
                                                    check_no_text_labels, no_autograph,
                                                    traced_once)
from keras_bertfam.preprocessing.errors import (_first_or_zero, carries_tf_errors,
                                                check_column_lengths, check_text_batch)
from keras_bertfam.preprocessing.global_attention import TF_OPS
from keras_bertfam.preprocessing.preprocessors import PretrainingPreprocessor, check_texts
from keras_bertfam.preprocessing.tokenizers import check_text_items
from keras_bertfam.tasks.optimization import AdamW, WarmupLinearDecay
from keras_bertfam.user_warnings import warn


class Task(RematChecked, KeepsVariablesOnError, keras.Model):
    """Base of every task. Subclasses build the functional graph and define `losses_and_metrics`."""

    def __setattr__(self, name, value):
        if name == "preprocessor":  # built with it, or attached after
            check_prepare_signature(self, value)
        # See Backbone.__setattr__ (torch.nn.Module refuses sublayers before Model.__init__).
        try:
            super().__setattr__(name, value)
        except AttributeError:
            object.__setattr__(self, name, value)

    # Arguments of `from_preset` that go to `default_preprocessor` rather than to the task.
    preprocessor_args = ("sequence_length", "batch_size", "masker", "seed", "group_by_length",
                         "pad_to_multiple_of")
    # The backbone families the task takes (None: any). A preset or backbone of another family is
    # refused when the task is built (`from_preset` on a BERT preset for an ALBERT objective).
    backbone_families = None
    # The task's name to a backbone that derives its global attention from the other inputs
    # (Longformer's `task_global_attention(features, task)`; None: no global attention).
    global_attention_task = None
    # Whether the task's labels are one array (a fine-tuning task with one output): then `y` as
    # a dict is refused by name (`check_labels_not_a_dict`); else a dict may be the task's
    # format (a pretrainer's {"mask_ids", ...}, a QuestionAnswerer's preprocessed positions).
    labels_are_one_array = False

    def __init__(self, *args, **kwargs):
        # Subclasses set their backbone and preprocessor, then build the functional graph here.
        check_backbone_and_preprocessor(self)
        _check_model_kwargs(self, kwargs)
        super().__init__(*args, **kwargs)

    def __call__(self, inputs, *args, **kwargs):
        # By name, as the backbone's (`complete_inputs`): fit, evaluate and predict call this too.
        return super().__call__(complete_inputs(self, inputs), *args, **kwargs)

    def call(self, inputs, training=None, mask=None, **kwargs):
        # JAX's fit / predict reach `call` through `stateless_call`, not `__call__`. `training`
        # is named so that Keras passes it (see `Backbone.call`).
        return super().call(complete_inputs(self, inputs), training=training, mask=mask,
                            **kwargs)

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, **kwargs):
        """The preprocessor `from_preset` attaches (None: the task takes model inputs)."""
        return None

    @classmethod
    def pretraining_task(cls, backbone, preprocessor):
        """The task `keras-bertfam pretrain` trains on `backbone` (ELECTRA builds two models)."""
        return cls(backbone=backbone, preprocessor=preprocessor)

    def _track_losses(self, names):
        """Mean trackers for each named loss / metric, reported by fit() (e.g. mlm_loss)."""
        self._trackers = {n: keras.metrics.Mean(name=n) for n in names}
        for n, tracker in self._trackers.items():
            setattr(self, f"_{n}_tracker", tracker)

    def losses_and_metrics(self, y, y_pred, sample_weight):
        """-> (total loss, {name: value}) for the named trackers."""
        raise NotImplementedError

    def check_head_inputs(self, x):
        """In-memory model inputs (a dict) read by the task's head beyond positions, checked on
        the host with the backbone's (`_checked_model_inputs`: in memory and batch by batch
        from a dataset, generator, PyDataset or torch DataLoader): a ValueError where they
        would compute silently wrong. None here (a dataset is then not mapped for it);
        `XLNetPretrainer`: its perm_mask and target_mapping."""

    def metric_weights(self, y, y_pred, sample_weight):
        """{name: what a batch's value of that tracked metric averages over} (the sum of the
        weights of a weighted mean: masked slots, real tokens, sample weights), by which the
        epoch's mean weights the batch, so that it is the metric of the whole data whatever the
        batching; a name left out counts its batch's rows (a per-example mean without weights).
        Rows alone gave a batch with 3 masked slots the weight of one with 30."""
        return {}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if self._user_loss():
            # `compile(loss=...)` given: Keras' compiled loss, as keras-hub's tasks do.
            return super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                        training=training)
        loss, values = self.losses_and_metrics(y, y_pred, sample_weight)
        # Weighted by the batch size, which (unlike a constant weight) depends on the data: on a
        # dataset of unknown length, TensorFlow runs the data-independent part of the step that
        # finds the end of the data, which would count one more (empty) step in every mean.
        batch = ops.cast(ops.shape(tree.flatten(y_pred)[0])[0], "float32")
        weights = self.metric_weights(y, y_pred, sample_weight)
        for name, value in values.items():
            self._trackers[name].update_state(value, sample_weight=weights.get(name, batch))
        loss = loss + ops.cast(sum(self.losses), loss.dtype) if self.losses else loss
        return _scale_for_replicas(loss)

    def _user_loss(self):
        return getattr(self, "_compile_loss", None) is not None

    @property
    def metrics(self):
        metrics = super().metrics
        if self._user_loss():  # the task's own loss terms are not computed: not reported
            trackers = {id(t) for t in getattr(self, "_trackers", {}).values()}
            metrics = [m for m in metrics if id(m) not in trackers]
        return metrics

    # === Variables the task's graph does not use ===
    # Whether the task's graph reads the backbone's `pooled_output` (a class attribute).
    uses_pooled_output = True

    def _unused_variable_ids(self):
        """Variables of the backbones' poolers when this task never reads `pooled_output` (a
        masked-LM or token-level task): the task does not train them (no "Gradients do not
        exist" warning on TensorFlow, no weight decay of variables without a gradient on JAX and
        PyTorch), but they stay in the model's weights (saved, loaded, converted)."""
        cached = self.__dict__.get("_unused_ids_cache")
        if cached is not None:
            return cached
        ids = set()
        if not type(self).uses_pooled_output:
            for layer in self._flatten_layers(include_self=False):
                if layer.name == "pooler" and isinstance(layer, keras.layers.Dense):
                    ids.update(id(v) for v in layer.weights)
        if getattr(self, "built", False):
            object.__setattr__(self, "_unused_ids_cache", ids)
        return ids

    def _split_unused(self, trainable, others):
        if not self.trainable:
            return trainable, others
        unused = self._unused_variable_ids()
        if not unused:
            return trainable, others
        return ([v for v in trainable if id(v) not in unused],
                others + [v for v in trainable if id(v) in unused])

    @property
    def trainable_weights(self):
        return self._split_unused(super().trainable_weights, [])[0]

    @property
    def non_trainable_weights(self):
        return self._split_unused(super().trainable_weights, super().non_trainable_weights)[1]

    @property
    def trainable_variables(self):
        return self._split_unused(super().trainable_variables, [])[0]

    @property
    def non_trainable_variables(self):
        return self._split_unused(super().trainable_variables,
                                  super().non_trainable_variables)[1]

    def _symbolic_build(self, iterator=None, data_batch=None):
        self._keep_epoch_iterator(iterator)
        return super()._symbolic_build(iterator=iterator, data_batch=data_batch)

    def _keep_epoch_iterator(self, iterator):
        """Keeps the epoch iterator of a `fit` that `_epoch_keyed` set up (`_EpochPosition`
        lets it read every epoch to its end)."""
        if iterator is not None and self.__dict__.get("_capture_epoch_iterator"):
            object.__setattr__(self, "_capture_epoch_iterator", False)
            object.__setattr__(self, "_fit_epoch_iterator", iterator)

    # === Run state in weights files: seed generators, the epoch's first step ===
    # The saved record `(epoch, the optimizer's step count when it began)` of `_epoch_keyed`.
    EPOCH_RECORD = "keras_bertfam_epoch"

    def _all_seed_generators(self):
        """The `keras.random.SeedGenerator`s of the task and its layers (dropout, ELECTRA's
        sampling), in a fixed order."""
        found, seen = [], set()
        for layer in self._flatten_layers(include_self=True):
            for generator in getattr(layer, "_seed_generators", ()):
                if id(generator) not in seen:
                    seen.add(id(generator))
                    found.append(generator)
        return found

    def save_own_variables(self, store):
        """Keras' own variables, and the state Keras does not save (so `BackupAndRestore` and
        `ModelCheckpoint` lost it): every seed generator's (`seed_generator_<i>`: a resumed
        run draws the dropout masks and samples the uninterrupted run drew) and the record of
        the epoch in progress (`EPOCH_RECORD`, see `_epoch_keyed`); and whose state each of
        the optimizer's positions holds (`weights_files.save_optimizer_record`: Keras loads it
        by position, onto other variables where the layers frozen differ)."""
        super().save_own_variables(store)
        for i, generator in enumerate(self._all_seed_generators()):
            store[f"seed_generator_{i}"] = generator.state
        record = self.__dict__.get("_epoch_record")
        if record is not None:
            store[self.EPOCH_RECORD] = np.asarray(record, dtype=np.int64)
        save_optimizer_record(self, store)

    def load_own_variables(self, store):
        """`save_own_variables`' state; a file without it (Keras' own, an earlier version's)
        loads as before, leaving the seed generators as they are. A `.keras` archive read on
        the fly has its weights' CRC-32 checked first (`weights_files.check_archive_store`),
        and optimizer state recorded as other variables' is refused
        (`weights_files.check_optimizer_store`)."""
        check_archive_store(store)
        if not self.__dict__.pop("_skip_saved_optimizer_record", False):  # compile_from_config
            check_optimizer_store(self, store)
        keys = list(store.keys())
        seeds = sorted((k for k in keys if k.startswith("seed_generator_")),
                       key=lambda k: int(k.rsplit("_", 1)[1]))
        own = {k: store[k] for k in keys if k not in seeds
               and k not in (self.EPOCH_RECORD, OPTIMIZER_RECORD)}
        super().load_own_variables(own)
        if seeds:
            generators = self._all_seed_generators()
            if len(generators) != len(seeds):
                # Another configuration of the task (a preset loaded with other dropout): its
                # weights fit, its random state does not. A resume refuses another
                # configuration before this (`_restore_backups`).
                warn(
                    f"The weights file holds the state of {len(seeds)} seed generators; "
                    f"{type(self).__name__} {self.name!r} has {len(generators)} (dropout "
                    f"layers, samplers): their state is not loaded.")
            else:
                for generator, key in zip(generators, seeds):
                    generator.state.assign(store[key])
        record = store[self.EPOCH_RECORD] if self.EPOCH_RECORD in keys else None
        object.__setattr__(self, "_loaded_epoch_record",
                           None if record is None else tuple(int(v) for v in record))

    # === PyTorch: dropout masks that a resumed fit draws again ===
    if keras.backend.backend() == "torch":

        def train_step(self, data):
            """Keras' torch `Dropout` (built without a seed) draws its masks from torch's
            global random state (`torch.nn.functional.dropout`), which no checkpoint holds and
            which Keras' torch loop also draws from when it opens a data iterator. Each step
            seeds that state from the task's own saved state (`_seed_torch_step`): a fit
            resumed from a backup draws the masks the uninterrupted run drew. The fast
            unseeded dropout kernel stays (Keras' seeded torch dropout makes a generator and a
            Bernoulli mask per call)."""
            self._seed_torch_step()
            return super().train_step(data)

        def _seed_torch_step(self):
            """Seeds torch's global random state for this step from the task's first seed
            generator's seed (its state, saved with the weights: `save_own_variables`) and the
            optimizer's step count (read at the first step of a fit, then counted). Nothing
            without seed generators (no dropout: nothing random is drawn from torch's state in a
            step). The CPU generator alone when no accelerator is in use: `torch.manual_seed`
            also seeds every device's (~0.8 ms a call here, the CPU generator's ~5 us)."""
            step = self.__dict__.get("_torch_step")
            if step is None:
                import torch

                generators = self._all_seed_generators()
                if not generators:
                    object.__setattr__(self, "_torch_step", [])
                    return
                accelerated = torch.cuda.is_initialized() or torch.backends.mps.is_available()
                seed = torch.manual_seed if accelerated else torch.default_generator.manual_seed
                base = int(keras.ops.convert_to_numpy(generators[0].state)[0])
                step = [seed, base, int(keras.ops.convert_to_numpy(self.optimizer.iterations))]
                object.__setattr__(self, "_torch_step", step)
            if step:
                seed, base, count = step
                step[2] += 1
                seed((base * 1_000_003 + count) % (2 ** 63))

    # === tf.distribute (keras-team/keras#20585; see keras_bertfam/distribute.py) ===
    if keras.backend.backend() == "tensorflow":

        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            """Builds the model, compiled metrics and losses and the optimizer before the step is
            traced. Keras does so on TensorFlow only under a strategy; without one the compiled
            metrics (and any optimizer slot) were created inside the first trace of `fit` /
            `evaluate`, and TensorFlow then traced the whole step a second time (a
            `tf.function` that creates variables is traced once to create them, once to run):
            ~4-5 s of CPU for a tiny task's first `fit` here. As Keras does on JAX, so here
            on every strategy."""
            self._keep_epoch_iterator(iterator)
            strategy = self._distribute_strategy
            if not self._needs_symbolic_build():
                # Only the optimizer's slots are missing, and they need no batch. Keras pulls one
                # anyway, from an iterator of its own: a raw-text pipeline (tokenizer, masker)
                # started twice per fit / evaluate, and a symbolic forward pass traced for
                # nothing (the preprocessor's tokenizer is the one layer never "built").
                with strategy.scope() if strategy is not None else contextlib.nullcontext():
                    if self.optimizer is not None and not self.optimizer.built:
                        self.optimizer.build(self.trainable_variables)
                    self._post_build()
                return
            if strategy is None:
                self._build_from_spec(iterator, data_batch)
                return
            # Build from the first replica's batch rather than Keras' strategy.reduce of the
            # distributed batch, which fails under MultiWorkerMirroredStrategy.
            from keras_bertfam.distribute import first_replica_batch

            if iterator is not None:
                for _, _, it in iterator:
                    data_batch = first_replica_batch(next(it), self.distribute_strategy)
                    break
            with self.distribute_strategy.scope():
                self._symbolic_build(data_batch=data_batch)

        def _build_from_spec(self, iterator, data_batch):
            """Keras' symbolic build from the batch's spec (no strategy): no batch is read, so
            a raw-text pipeline is not started for it. A spec Keras cannot make symbolic
            (ragged, sparse), or a model it cannot build so, leaves Keras' own deferral to the
            first trace."""
            if data_batch is None:
                dataset = getattr(iterator, "_distributed_dataset", None)
                data_batch = getattr(dataset, "element_spec", None)
            if data_batch is None or not all(isinstance(s, (tf.TensorSpec, tf.Tensor, np.ndarray))
                                             for s in tree.flatten(data_batch)):
                return
            try:
                self._symbolic_build(data_batch=data_batch)
            except Exception:  # a call Keras cannot run symbolically: its own deferral, and
                return  # any error of the inputs is the trace's, where it always was

        def _needs_symbolic_build(self):
            """Whether Keras' symbolic build has anything but the optimizer to build: a model
            layer (the preprocessor's aside: the model never calls them) or compiled metrics or
            losses not built yet."""
            if not _model_layers_built(self):
                return True
            return any(c is not None and not c.built
                       for c in (self._compile_metrics, self._compile_loss))

        def train_step(self, data):
            from keras_bertfam.distribute import per_worker_logs

            # Every op of the step waits for the batch. Keras' TF trainer asks a dataset of
            # unknown length for one batch past its end; the ops that do not read the data
            # (the optimizer's iteration count, AdamW's weight decay) would otherwise run before
            # the end-of-data error: one more optimizer step per epoch than batches.
            batch = [t for t in tree.flatten(data) if isinstance(t, tf.Tensor)]
            with tf.control_dependencies(batch[:1]):
                logs = super().train_step(data)
            return per_worker_logs(logs, self.distribute_strategy)

        def test_step(self, data):
            from keras_bertfam.distribute import per_worker_logs

            return per_worker_logs(super().test_step(data), self.distribute_strategy)

        def make_predict_function(self, force=False):
            """Keras calls its predict function on each batch's tensors, so its first trace is
            for the first batch's size, and a batch of another size (a predict's last, partial
            batch; a later predict with another `batch_size`) traces it again. Ours is traced
            for any batch size at its first call with each kind of batch (structure, dtypes,
            ranks): in-memory inputs come as a tuple and a dataset's as its element, and a
            predict on a dataset after one on arrays was traced for its first batch's size
            again, then for any. Once per predict, however its batches are cut.
            """
            if self.predict_function is not None and not force:
                return self.predict_function
            super().make_predict_function(force=force)
            function = self.predict_function
            if self._distribute_strategy is not None or not hasattr(function,
                                                                     "get_concrete_function"):
                return function
            traced = set()

            def predict_function(data):
                specs = tree.map_structure(any_batch_size, data)
                kind = repr(tree.map_structure(lambda s: (type(s).__name__, s.dtype,
                                                          s.shape.rank), specs))
                if kind not in traced:
                    function.get_concrete_function(specs)
                    traced.add(kind)
                return function(data)

            self.predict_function = predict_function
            return predict_function

    # === Serving (kb.export) ===
    # String inputs of the exported `serving_default` signature, one per packed segment.
    serving_inputs = ("text",)
    # Whether the string signature reads a literal mask token in its text ("[MASK]", "<mask>")
    # as the mask id, as HF's fill-mask pipeline does: the tasks whose served outputs are at the
    # mask positions. Any other task's signature tokenizes it as text, as its preprocessor does.
    serving_reads_mask_tokens = False
    # Whether the task packs XLNet's layout on an XLNet backbone (the tasks of HF's XLNetFor*
    # heads: classification reads `<cls>` last, tagging every piece where XLNet's puts it).
    follows_xlnet_layout = False

    @property
    def packing_layout(self):
        """How this task's rows are packed: "xlnet" (`A <sep> (B <sep>) <cls>`, padded on the
        left: a task that `follows_xlnet_layout`, on an XLNet backbone) or "bert" (`[CLS] A [SEP]
        (B [SEP])`, padded on the right)."""
        if self.follows_xlnet_layout and getattr(self.backbone, "family", None) == "xlnet":
            return "xlnet"
        return "bert"

    @property
    def serving_padding_side(self):
        """Where the packed rows' padding is: the export's dynamic padding cuts there."""
        return "left" if self.packing_layout == "xlnet" else "right"

    def serving_features(self, features, special_token_ids):
        """Packed `{token_ids, segment_ids, padding_mask}` -> this task's model inputs
        (`special_token_ids`: the tokenizer's `{"mask": id, ...}`)."""
        return features

    def serving_outputs(self, features, outputs):
        """Model outputs -> the named outputs of the exported signatures (keras.ops)."""
        return dict(outputs) if isinstance(outputs, dict) else {"logits": outputs}

    def serving_call(self, inputs):
        """The model on serving inputs. A task whose training graph is not its inference graph
        (ELECTRA samples replacements; XLNet carries a memory) runs its parts instead."""
        return self({k: inputs[k] for k in self.input}, training=False)

    def serving_options(self, **options):
        """`export_saved_model`'s options for this task's string signature, checked -> the
        keyword arguments of `serving_strings` (QA: `handle_impossible_answer`,
        `null_score_diff_threshold`). A task without such options refuses any."""
        if options:
            raise ValueError(f"{type(self).__name__}'s export takes no {', '.join(options)} "
                             "(an option of a QuestionAnswerer's string signature).")
        return {}

    def serving_strings(self, texts, tokenizer, sequence_length, outputs_of, **options):
        """The string signature's outputs from its raw inputs, for a task that runs the model
        on something else than one packed row per example (QA: every window of a long
        context); None for the export's tokenize-and-pack. `outputs_of(features)` runs the
        model and `serving_outputs`; `options` come from `serving_options`."""
        return None

    def serving_tokenize(self, texts, tokenizer, tokenize):
        """The string signature's texts [B] -> token ids [B, (P)], as this task's preprocessor
        tokenizes a text (`tokenize`: `tokenizer`'s servable call)."""
        return tokenize(texts)

    def serving_pack(self, segments, sequence_length, special_token_ids):
        """Ragged token ids per segment -> packed features, or None for `[CLS] A [SEP] (B [SEP])`
        with the preprocessor's packer (XLNet's layout packs `A <sep> <cls>` on the left)."""
        if self.packing_layout != "xlnet":
            return None
        from keras_bertfam.preprocessing.packing import xlnet_pack

        return xlnet_pack(*segments, sequence_length=sequence_length,
                          sep_token_id=special_token_ids["sep"],
                          cls_token_id=special_token_ids["cls"],
                          pad_token_id=special_token_ids["pad"])

    # === Compile defaults ===
    # Peak learning rate of `compile(optimizer="auto")`; fine-tuning tasks use BERT's 5e-5.
    default_learning_rate = 1e-4
    # Fraction of the steps spent warming up when `fit` fills in `total_steps` (fine-tuning).
    default_warmup_ratio = 0.1

    def compile(self, optimizer="auto", learning_rate=None, warmup_steps=None, total_steps=None,
                weight_decay=0.01, warmup_ratio=None, **kwargs):
        """`optimizer="auto"`: AdamW (β2 0.999, ε 1e-6, no decay on LayerNorm and biases, as
        BERT's AdamWeightDecay) with linear warmup and linear decay to 0 at `total_steps`.

        `learning_rate` defaults to the task's `default_learning_rate`. When `total_steps` is not
        given, the first `fit` sets it to `epochs × steps per epoch` (when the dataset's length is
        known) with `warmup_ratio` (default `default_warmup_ratio`) of them warming up, unless
        `warmup_steps` is given; until then the rate is constant after warmup. `loss`,
        `metrics` and `weighted_metrics` of "auto" (keras-hub's defaults written out) are the
        task's defaults, as when not given."""
        kwargs = {k: None if isinstance(v, str) and v == "auto" and k in (
            "loss", "metrics", "weighted_metrics") else v for k, v in kwargs.items()}
        self._auto_schedule = None
        if optimizer == "auto":
            schedule = WarmupLinearDecay(
                self.default_learning_rate if learning_rate is None else learning_rate,
                warmup_steps or 0, total_steps)
            if total_steps is None:
                ratio = self.default_warmup_ratio if warmup_ratio is None else warmup_ratio
                self._auto_schedule = (schedule, ratio if warmup_steps is None else None)
            optimizer = AdamW(
                learning_rate=schedule,
                weight_decay=weight_decay,
                beta_2=0.999,
                epsilon=1e-6,
                global_clipnorm=1.0,
            )
            optimizer.exclude_from_weight_decay(var_names=["layer_norm", "bias", "gamma", "beta"])
        elif (keras.backend.backend() == "tensorflow"
              and isinstance(optimizer, keras.optimizers.Adam) and not isinstance(optimizer, AdamW)):
            warn(
                f"{type(optimizer).__module__}.{type(optimizer).__name__} on TensorFlow updates "
                f"the second moment of a token seen k times in a batch with the sum of its k "
                f"squared gradient slices instead of the square of their sum (without clipping), "
                f"clips by a global norm taken over those unsummed slices (with "
                f"global_clipnorm), and clips each replica's gradient before the all-reduce "
                f"under tf.distribute: a different step from JAX, torch and one device. "
                f"kb.tasks.AdamW takes the same arguments and has none of these problems "
                f"(compile's default).")
        super().compile(optimizer=optimizer, **kwargs)

    def compile_from_config(self, config):
        """`keras.saving.load_model` of a compiled task: compiled again with its saved optimizer
        (AdamW and its schedule, as `compile` made them), losses and metrics, the optimizer built
        so that its saved moments and step count load. Keras compiles no model whose `compile`
        is overridden (it warns), so a reloaded task trained on from a fresh optimizer.

        An entry this session cannot rebuild (a class of the user's own that is neither
        registered nor in `custom_objects`, e.g. a learning-rate schedule defined in a script)
        is left to `compile`'s default, with a warning naming it: the task loads, as keras-hub's
        tasks do (which Keras never compiles from the file). Without its saved optimizer, the
        file's optimizer state (another optimizer's) is skipped by the load that follows: the
        optimizer starts fresh, as the warning says."""
        rebuilt, lost = {}, {}
        for key, value in config.items():
            try:
                rebuilt[key] = keras.saving.deserialize_keras_object(value)
            except TypeError as error:  # Keras' "could not be deserialized" / "locate class"
                lost[key] = error
        if lost:
            found = [re.findall(r"Could not locate (?:class|function) '([^']+)'", str(e))
                     for e in lost.values()]
            names = sorted({n for names in found for n in names})
            what = (f"the class{'es' if len(names) > 1 else ''} "
                    f"{', '.join(map(repr, names))} could not be found" if names
                    else "; ".join(str(e).splitlines()[0] for e in lost.values()))
            warn(
                f"keras.saving.load_model: {type(self).__name__} {self.name!r} could not "
                f"rebuild its saved compile {'/'.join(lost)} ({what}): it is "
                f"compiled with compile()'s default for {'it' if len(lost) == 1 else 'them'}"
                f"{' and without the saved optimizer state' if 'optimizer' in lost else ''}. "
                f"Pass custom_objects={{name: class}} to load_model, or register the class "
                f"with @keras.saving.register_keras_serializable(), to restore it.")
        self.compile(**rebuilt)
        if "optimizer" in lost:
            # `load_model` loads the file's state next (`load_own_variables`): not this
            # optimizer's, so that load only skips it (Keras would assign it by position when
            # the variable counts agree; our record check would refuse the other class).
            optimizer = self.optimizer

            def skip_saved_state(store):
                del optimizer.load_own_variables

            optimizer.load_own_variables = skip_saved_state
            object.__setattr__(self, "_skip_saved_optimizer_record", True)
        elif self.built:
            self.optimizer.build(self.trainable_variables)

    def _task_class_name(self):
        """The library's task class this task is (a user's subclass: the class it extends)."""
        for cls in type(self).__mro__:
            if cls.__module__.startswith("keras_bertfam.tasks.") and cls is not Task:
                return cls.__name__
        return type(self).__name__

    def save_weights(self, filepath, *args, **kwargs):
        """Keras' `save_weights`; a `.weights.h5` file records the task's class, the settings
        that change what its weights compute and each tensor's digest too (`weights_files.
        record`, read by `load_weights`: another task's head of the same shapes, a model
        configured otherwise and a byte changed since are refused)."""
        super().save_weights(filepath, *args, **kwargs)
        record(filepath, self, task_class=self._task_class_name())

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """Keras' `load_weights`, with a compiled task's optimizer built first: a compiled
        task's optimizer has no variables before its first step, and Keras then skips the file's
        optimizer state (moments, step count) with a warning, so `fit(initial_epoch=...)` went
        on from step 0 of the schedule with fresh moments. A file that does not fit the task
        (`check_weights_file`: another family, size, head or task class, or settings that
        change what the weights compute) or whose bytes changed since it was saved (its tensors'
        digests, a `.keras` archive's CRC-32) is refused before anything is loaded, unless
        `skip_mismatch=True` (Keras' partial loading: none of these checks, digests included)."""
        if (getattr(self, "optimizer", None) is not None and not self.optimizer.built
                and self.built and str(filepath).endswith((".weights.h5", ".keras"))):
            self.optimizer.build(self.trainable_variables)
        with checked_load(self, filepath, self._task_class_name(), skip_mismatch):
            return super().load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)

    def _fill_schedule(self, dataset, epochs, steps_per_epoch):
        """Sets an auto schedule's total (and warmup) steps from the first fit's length; returns
        what `_unfill_schedule` needs to undo it (None when nothing was set)."""
        auto = getattr(self, "_auto_schedule", None)
        if not auto:
            return None
        steps = steps_per_epoch
        if steps is None and isinstance(dataset, tf.data.Dataset):
            n = int(dataset.cardinality())
            steps = n if n > 0 else None
        if not steps:
            return None
        schedule, ratio = auto
        undo = (auto, schedule.warmup_steps)
        schedule.total_steps = int(steps * epochs)
        if ratio is not None:
            schedule.warmup_steps = int(ratio * schedule.total_steps)
        self._auto_schedule = None
        return undo

    def _unfill_schedule(self, undo):
        """A fit that failed before its first optimizer step did not decide the schedule: the
        next fit fills it from its own length (its train step is traced anew only if that
        length differs: `make_train_function`)."""
        auto, warmup_steps = undo
        schedule, _ = auto
        schedule.total_steps, schedule.warmup_steps = None, warmup_steps
        self._auto_schedule = auto

    # === Raw inputs through the preprocessor ===
    def _prepare(self, x, y=None, sample_weight=None, batch_size=None, training=True,
                 shuffle=False, epoch_keyed=False):
        """Raw inputs (or model inputs, without a preprocessor) -> what Keras' `fit`, `evaluate`
        and `predict` take: `(x, y, sample_weight, batch_size)`, the preprocessor's pipeline
        built. `epoch_keyed` (`fit` without `steps_per_epoch`): a pretraining preprocessor's
        raw training data is checked, kept for `_resume_position` / `_epoch_keyed`, which
        build its pipeline once, at the run's position, and x is an `_EpochKeyedData` with
        its steps an epoch (`batches_per_epoch`): no pipeline is built here. So for a
        fine-tuning preprocessor that maps each batch on its own (`prepares_batch_by_batch`)
        on input of known length: its steps an epoch are the input's batches (a fit resumed
        past its first batch built the pipeline here for the length, then again from the
        position)."""
        batch_size = check_batch_size(batch_size)
        check_sample_weights(sample_weight, type(self).__name__)
        preprocessor = getattr(self, "preprocessor", None)
        if preprocessor is None:
            check_model_inputs(x, type(self).__name__)
            # Model inputs as Python lists (keras-hub's `fit(x=features, y=[0, 3])`): arrays,
            # which Keras' data adapters take.
            x, y = _arrays(x), _arrays(y)
            return self._checked_model_inputs(x, y), y, _arrays(sample_weight), batch_size
        check_raw_inputs(x, type(self).__name__, getattr(preprocessor, "raw_inputs", "raw text"))
        if hasattr(preprocessor, "check_raw") and not isinstance(x, tf.data.Dataset):
            preprocessor.check_raw(x, type(self).__name__)  # its one check of x's shape
        if isinstance(preprocessor, PretrainingPreprocessor) and \
                not isinstance(x, tf.data.Dataset):
            check_texts(x, type(self).__name__)
        check_example_counts(x, y, sample_weight, type(self).__name__)
        check_backbone_and_preprocessor(self)  # again: `preprocessor.sequence_length` is settable
        raw = None  # what `_resume_position` and `_epoch_keyed` build the pipeline from
        keyed = training and epoch_keyed and hasattr(preprocessor, "prepare_epochs")
        if isinstance(x, tf.data.Dataset):
            if y is not None:
                raise ValueError(
                    "With a tf.data.Dataset, pass labels inside the dataset, not as y=.")
        else:
            examples = self._raw_examples(x, y, sample_weight)
            if not training and hasattr(preprocessor, "call_in_memory"):
                # predict / evaluate: arrays in milliseconds, not a pipeline built per call.
                x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(
                    preprocessor.call_in_memory(examples))
                names = self.input.keys() if isinstance(self.input, dict) else x.keys()
                x = self._checked_features({k: v for k, v in x.items() if k in names})
                return x, y, sample_weight, batch_size
            if training and shuffle and hasattr(preprocessor, "prepare_epochs"):
                raw = (tf.data.Dataset.from_tensor_slices(examples), batch_size or 32)
            if raw is None or not keyed:
                x = batched_examples(examples, batch_size or 32, shuffle)
        if training:
            object.__setattr__(self, "_raw_training_data", raw or (x, None))
        if keyed:
            data, shuffle_batch_size = self._raw_training_data
            steps = preprocessor.batches_per_epoch(data, shuffle_batch_size=shuffle_batch_size)
            return _EpochKeyedData(steps), None, None, None
        if training and epoch_keyed and getattr(preprocessor, "prepares_batch_by_batch", False):
            steps = int(x.cardinality())
            if steps > 0:  # an epoch is the input's batches: built once, at the run's position
                return _EpochKeyedData(steps), None, None, None
        # (batch_size: used by a preprocessor that re-batches, QuestionAnswerer's windows)
        prepared = preprocessor.prepare(x, training=training, batch_size=batch_size)
        return self._checked_features(self._drop_unused_features(prepared)), None, None, None

    def _checked_model_inputs(self, x, y=None):
        """Model inputs a user gives (preprocessor=None, `*_on_batch`): token and segment ids
        checked against the backbone's tables, masks for 0 and 1 only, the head's own inputs
        (`check_head_inputs`), and label ids against
        theirs (`y`, or a dataset's labels: `_label_tables`), in memory now
        (`_check_ids_in_memory`, `check_masks_in_memory`) or, for a
        dataset, in its `tf.data` graph as it is read (`check_ids`; the head's own inputs on
        the host, batch by batch: `checked_data`), or, for a Python generator, a
        `keras.utils.PyDataset` or a torch `DataLoader`, batch by batch as Keras reads it
        (`checked_data`, with these checks); then `_checked_features`."""
        if is_batch_stream(x):
            return checked_data(x, self._checked_model_inputs)
        if isinstance(x, tf.data.Dataset) and \
                type(self).check_head_inputs is not Task.check_head_inputs:
            x = checked_data(x, lambda features, y: self.check_head_inputs(features))
        if isinstance(x, dict) and "token_ids" in x:
            _check_ids_in_memory(self, x)
            check_masks_in_memory(self, x)
            self.check_head_inputs(x)
            _check_labels_in_memory(self, y)
        return self._checked_features(x, ids=True)

    def _checked_features(self, x, ids=False):
        """Model inputs (an in-memory dict, checked now, or a dataset, checked in its `tf.data`
        graph as it is read, one map for every check) with `check_global_attention`: a row whose
        global attention would not fit its Longformer backbone's `max_global_tokens` stops with
        an error naming its count, before the model's (traced, maybe XLA-compiled) step. `ids`:
        a dataset's token and segment ids are checked too (`check_ids`; a preprocessor's
        output needs no such check: its tokenizer fits the backbone, checked when the task was
        built)."""
        checks = []
        if ids and isinstance(x, tf.data.Dataset) and _id_tables(self):
            checks.append(check_ids)
        if needs_global_attention_check(self):
            checks.append(check_global_attention)
        if getattr(self.__dict__.get("backbone"), "task_global_attention", None) is not None:
            checks.insert(0, drop_derived_global_attention)
        if not checks:
            return x

        if isinstance(x, tf.data.Dataset):
            spec = x.element_spec
            features = spec[0] if isinstance(spec, tuple) else spec
            if not (isinstance(features, dict) and "token_ids" in features):
                return x
            if ids:  # a length known before the data is read: refused before any tracing
                _check_token_ids_shape(self, tuple(features["token_ids"].shape),
                                       features["token_ids"].dtype.name)
            labels = ids and isinstance(spec, tuple) and len(spec) > 1 and bool(
                _label_tables(self, spec[1]))
            checked = self._checks_function(checks, labels)
            if labels:
                return x.map(no_autograph(lambda f, y, *rest: (*checked(f, y), *rest)))
            if isinstance(spec, tuple):
                return x.map(no_autograph(lambda f, *rest: (checked(f), *rest)))
            return x.map(checked)
        if isinstance(x, dict) and "token_ids" in x and drop_derived_global_attention in checks:
            x = drop_derived_global_attention(self, x)
        if isinstance(x, dict) and "token_ids" in x and check_global_attention in checks:
            check_global_attention(self, x)
        return x

    def _checks_function(self, checks, labels):
        """`checks` in turn on a dataset's model inputs, and with `labels` `check_label_ids` on
        its labels, as one function traced once per task and what the checks read
        (`traced_once`): each fit's, evaluate's and predict's pipeline traced them again (3.5%
        of a JAX test process' CPU). A new backbone table size, position table or Longformer
        cap (`max_global_tokens`) traces them anew."""
        backbone = self.backbone
        tables = getattr(self, "label_id_tables", None)
        key = (id(backbone), tuple(_id_tables(self)),
               getattr(backbone, "max_sequence_length", None),
               getattr(backbone, "max_global_tokens", None), takes_global_attention(self),
               tuple(tables()) if tables is not None else ())

        def run(features, *y):
            for check in checks:
                features = check(self, features)
            return (features, check_label_ids(self, y[0])) if y else features

        return traced_once(self, key, ("checks", *checks, labels), run)

    def _raw_examples(self, x, y, sample_weight):
        """In-memory raw inputs -> what `tf.data.Dataset.from_tensor_slices` takes."""
        return x if y is None else (x, y) if sample_weight is None else (x, y, sample_weight)

    def _drop_unused_features(self, ds):
        """Removes features the model does not take (a DistilBERT backbone has no segment_ids;
        Keras warns on every step about an input it does not expect)."""
        names = self.input.keys() if isinstance(self.input, dict) else None
        spec = ds.element_spec
        x_spec = spec[0] if isinstance(spec, tuple) else spec
        if names is None or not isinstance(x_spec, dict) or set(x_spec) <= set(names):
            return ds

        def keep(x):
            return {k: v for k, v in x.items() if k in names}

        if isinstance(spec, tuple):
            return ds.map(no_autograph(lambda x, *rest: (keep(x), *rest)))
        return ds.map(no_autograph(keep))

    @carries_tf_errors
    def fit(self, x=None, y=None, batch_size=None, sample_weight=None, validation_data=None,
            **kwargs):
        for name in ("epochs", "initial_epoch", "steps_per_epoch"):
            _check_count(kwargs.get(name), name, minimum=0 if name == "initial_epoch" else 1)
        if not self.compiled:
            self.compile()  # the task's defaults, as keras-hub tasks come compiled
        self._check_labels_given(x, y, "fit")
        split = kwargs.pop("validation_split", None)
        if split and validation_data is None and getattr(self, "preprocessor", None) is not None:
            x, y, sample_weight, validation_data = self._split_for_validation(
                x, y, sample_weight, split)
        elif split:
            kwargs["validation_split"] = split  # Keras' own: arrays, or validation_data wins
        # In-memory examples are shuffled every epoch (`shuffle=True`, Keras' default for arrays).
        shuffle = kwargs.get("shuffle", True) and not isinstance(x, tf.data.Dataset)
        # A pretraining preprocessor's pipeline is built once, at the run's position, after
        # the backups are restored (`_resume_position`, `_epoch_keyed`); not here too.
        x, y, sample_weight, batch_size = self._prepare(
            x, y, sample_weight, batch_size, shuffle=shuffle,
            epoch_keyed=kwargs.get("steps_per_epoch") is None)
        keyed = isinstance(x, _EpochKeyedData)
        if isinstance(x, (tf.data.Dataset, types.GeneratorType)) or keyed:
            kwargs.setdefault("shuffle", False)  # a dataset is shuffled upstream, if at all
        filled = self._fill_schedule(x, kwargs.get("epochs", 1),
                                     x.steps if keyed else kwargs.get("steps_per_epoch"))
        try:
            # Keras keeps the epoch a BackupAndRestore restored (`_initial_epoch`) after that fit:
            # a later fit of this model started there, whatever its `initial_epoch`.
            self._initial_epoch = None
            for name in ("_epoch_record", "_fit_epoch_iterator", "_capture_epoch_iterator",
                         "_torch_step"):
                object.__setattr__(self, name, None)
            if keyed:  # n batches an epoch, counted without building the pipeline, or None
                every = self._steps_per_execution()
                if x.steps and x.steps % every:
                    # Keras runs whole executions on our repeated pipeline: the epoch's last
                    # one would train on the next epoch's batches (5 batches, 2 a run: 6 steps)
                    raise ValueError(
                        f"steps_per_execution={every} does not divide the {x.steps} batches of "
                        f"an epoch: the last execution would train on the next epoch's "
                        f"batches. Compile with a steps_per_execution that divides {x.steps}, "
                        f"or choose batch_size so that it does.")
                if x.steps:
                    kwargs = dict(kwargs, steps_per_epoch=x.steps)
                self._restore_backups(kwargs, x.steps)
                build = self._resume_position if x.steps else self._epoch_keyed
                x, kwargs = build(None, kwargs)
            else:
                finite = x
                x, kwargs = one_iterator(x, kwargs, every=self._steps_per_execution())
                self._restore_backups(kwargs, kwargs.get("steps_per_epoch"))
                if x is not finite:  # our pipeline, repeated: n batches an epoch
                    x, kwargs = self._resume_position(x, kwargs)
                elif isinstance(x, tf.data.Dataset) and kwargs.get("steps_per_epoch") is None:
                    x, kwargs = self._epoch_keyed(x, kwargs)
            if validation_data is not None and getattr(self, "preprocessor", None) is not None:
                data = (validation_data,) if isinstance(validation_data, tf.data.Dataset) else \
                    tuple(validation_data)
                self._check_labels_given(data[0], data[1] if len(data) > 1 else None, "fit")
                vx, vy, vw, _ = self._prepare(*data, training=False)
                vx, kwargs = one_iterator(vx, kwargs, "validation_steps",
                                          every=self._steps_per_execution())
                validation_data = vx if vy is None else (vx, vy) if vw is None else (vx, vy, vw)
            elif isinstance(validation_data, tf.data.Dataset) or is_batch_stream(validation_data):
                validation_data = self._checked_model_inputs(validation_data)  # ids checked
            elif isinstance(validation_data, (tuple, list)) and validation_data:
                self._checked_model_inputs(*validation_data[:2])  # in memory: checked now
            with warnings.catch_warnings():
                for backbone in _backbones(self):
                    # XLNet's query stream (its mask embedding) is not on a fine-tuning task's
                    # graph: no gradient, as in HF (torch skips it silently), where Keras warns
                    # "Gradients do not exist ... did you forget to provide a `loss`?". Only
                    # when those are the only variables without one.
                    paths = [w.path for layer in getattr(backbone, "_query_layers", ())
                             for w in layer.weights]
                    if paths:
                        warnings.filterwarnings("ignore", message=re.escape(
                            f"Gradients do not exist for variables {paths!r} when"))
                _read_once(x, kwargs.get("steps_per_epoch"))  # (an epoch: a corpus stream)
                # (our pipelines' and the user's datasets alike: see without_autotune_model)
                x = without_autotune_model(x)
                validation_data = without_autotune_model(validation_data)
                with _global_torch_random_state_kept():
                    history = super().fit(x=x, y=y, batch_size=batch_size,
                                          sample_weight=sample_weight,
                                          validation_data=validation_data, **kwargs)
            # (A BackupAndRestore may have restored the last epoch: nothing left to train.)
            start = max(kwargs.get("initial_epoch", 0) or 0, self._initial_epoch or 0)
            if not history.history and kwargs.get("epochs", 1) > start:
                raise ValueError(self._no_training_step_message())
            return history
        except BaseException:
            if filled and int(keras.ops.convert_to_numpy(self.optimizer.iterations)) == 0:
                self._unfill_schedule(filled)
            raise

    def _check_labels_given(self, x, y, method):
        """A fine-tuning task on in-memory raw examples trains and evaluates on labels: without
        `y` Keras' message was "None values not supported"."""
        check_labels_not_a_dict(self, x, y)
        preprocessor = getattr(self, "preprocessor", None)
        finetuning = isinstance(preprocessor, FinetuningPreprocessor)
        if finetuning and self.labels_are_one_array:  # class ids (or targets): not strings
            check_no_text_labels(x, type(self).__name__, getattr(self, "num_classes", None),
                                 x_parts=2 if preprocessor.takes_a_pair else 1,
                                 pairs=isinstance(preprocessor, TextClassifierPreprocessor))
        if finetuning and isinstance(x, tf.data.Dataset) and not _has_labels(x.element_spec):
            raise ValueError(
                f"{type(self).__name__}.{method} needs labels: got a dataset whose elements are "
                f"raw examples alone ({x.element_spec}). Yield (x, labels) pairs, e.g. "
                f"tf.data.Dataset.from_tensor_slices((texts, labels)) (predict takes x alone).")
        if (y is None and finetuning and _num_examples(x) is not None):
            raise ValueError(
                f"{type(self).__name__}.{method} needs labels: got x ({_num_examples(x)} "
                f"examples) and y=None. Pass y=..., one label per example (predict takes x "
                f"alone).")

    def _split_for_validation(self, x, y, sample_weight, split):
        """Keras' `validation_split` for raw examples in memory (keras-hub's tasks take it for
        arrays): the last `split` fraction of the examples, before any shuffling, is the
        validation data. Keras' own split cannot: a preprocessor turns them into a dataset."""
        name = type(self).__name__
        if isinstance(split, bool) or not isinstance(split, (float, int, np.floating)) or \
                not 0 < split < 1:
            raise ValueError(f"validation_split must be a float between 0 and 1 (the fraction "
                             f"of the examples held out), got {split!r}.")
        n = _num_examples(x)
        if n is None:
            raise ValueError(
                f"{name}.fit takes validation_split only for in-memory examples (a list or "
                f"array of texts, or a tuple of such columns), got a {type(x).__name__}: pass "
                f"validation_data=... instead (a tf.data.Dataset's length is not known to "
                f"split).")
        check_example_counts(x, y, sample_weight, name)
        cut = int(np.floor(n * (1.0 - split)))
        if cut == 0:
            raise ValueError(
                f"validation_split={split} of {n} example{'s' * (n != 1)} leaves no training "
                f"example: provide more data or a smaller validation_split.")

        def part(data, start, end):
            if data is None:
                return None
            if isinstance(data, tuple):
                return tuple(part(d, start, end) for d in data)
            if isinstance(data, dict):
                return {k: part(v, start, end) for k, v in data.items()}
            return data[start:end]

        held = tuple(v for v in (part(x, cut, n), part(y, cut, n), part(sample_weight, cut, n))
                     if v is not None)
        return part(x, 0, cut), part(y, 0, cut), part(sample_weight, 0, cut), held

    def _steps_per_execution(self):
        """Keras' `steps_per_execution` of the compiled model (1 before `compile`)."""
        return int(getattr(self, "steps_per_execution", None) or 1)

    def _restore_backups(self, kwargs, steps_per_epoch):
        """Restores the `BackupAndRestore` callbacks' backups now (Keras restores in
        `on_train_begin`, after the data is set up; it restores again, from the same files), to
        know where the run resumes, and checks that each backup is this run's: its directory is
        a writable directory, its files load (else an error naming the directory and the file),
        and it was written by a task of the same class and configuration (backbone,
        preprocessor and its seeds), at the same number of steps an epoch (both recorded in the
        directory's `RUN_FILE` when the run starts)."""
        for backup in _callback_list(kwargs):
            if not isinstance(backup, keras.callbacks.BackupAndRestore):
                continue
            check_backup_dir(backup.backup_dir)
            run = {"task": type(self).__name__, "steps_per_epoch": steps_per_epoch,
                   "config": _without_names(json.loads(json.dumps(self.get_config(),
                                                                  default=repr)))}
            path = os.path.join(str(backup.backup_dir), RUN_FILE)
            if os.path.exists(path):
                with open(path) as f:
                    try:
                        saved = json.load(f)
                    except ValueError as e:
                        raise ValueError(f"The backup run file {path!r} is damaged ({e}): "
                                         f"delete {str(backup.backup_dir)!r} to start afresh.")
                differences = _differences(saved, run)
                if differences:
                    raise ValueError(
                        f"The backup in {str(backup.backup_dir)!r} was written by another run: "
                        f"{'; '.join(differences[:5])} (saved, then this run's). Resuming would "
                        f"train on from another model's or another run's state. Use another "
                        f"backup_dir, or delete this one to start afresh.")
            try:
                backup.set_model(self)
                object.__setattr__(self, "_loaded_epoch_record", None)
                backup.on_train_begin()
            except (OSError, ValueError, KeyError, TypeError) as e:
                kind = OSError if isinstance(e, OSError) else ValueError
                raise kind(
                    f"Could not restore the backup in {str(backup.backup_dir)!r} "
                    f"(latest.weights.h5, training_metadata.json): {type(e).__name__}: "
                    f"{str(e)[:1000]}. It is damaged (truncated, partly written) or was written "
                    f"by another model; delete the directory to start afresh.") from e
            if self._initial_epoch is not None:
                # Keras' callback counts epochs from 0 in the resumed run until an epoch ends:
                # a backup written before that said epoch 0 (a second resume then failed).
                backup._current_epoch = self._initial_epoch
            if not os.path.exists(path):
                os.makedirs(str(backup.backup_dir), exist_ok=True)
                with open(path, "w") as f:
                    json.dump(run, f)

    def _resume_position(self, ds, kwargs):
        """The repeated pipeline of `one_iterator` (n batches an epoch), started where the run
        resumes rather than at its first batch.

        Our pipelines are seeded streams: epoch e's masks (the masker's per-example draws from
        `tf.data.Dataset.random`), pairings and shuffled order are the e-th repetition of the
        pipeline. A new `fit` builds a new pipeline, whose first repetition is epoch 0's. So a fit
        that starts at epoch k (`initial_epoch=k`, or the epoch a `BackupAndRestore` callback
        restores) reads the pipeline from batch k·n, and one restored from a mid-epoch backup
        (`BackupAndRestore(save_freq=<int>)`: Keras restarts the saved epoch at its first batch,
        and the restored weights have seen the batches before the backup) from the restored
        optimizer's step count, and stops after `epochs`·n steps in all: the same batches in the
        same order, and the same number of steps, as the run without the interruption.

        Reaching the position skips input batches, not prepared ones, where a batch's
        preparation depends on nothing before it: a pretraining preprocessor's pipeline is
        built epoch by epoch (`prepare_epochs`: every epoch's order and masks from its number,
        so the skipped epochs are not read at all, and the resumed epoch's first batches not
        masked), a fine-tuning one's `prepare` (a map of each batch; not `group_by_length`'s
        regrouping) runs on the input from the position. Otherwise the preprocessing of every
        batch skipped runs again.

        `ds` is None where `_prepare` built no pipeline (`_EpochKeyedData`: a pretraining
        preprocessor's raw data, checked, of n batches an epoch, or a fine-tuning one's input
        of n batches): the pipeline built here is the fit's only one."""
        callbacks = _callback_list(kwargs)
        backups = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
        n, epochs = kwargs["steps_per_epoch"], kwargs.get("epochs", 1)
        epoch = self._initial_epoch or kwargs.get("initial_epoch", 0) or 0
        position = epoch * n
        if backups and self._initial_epoch is not None:
            steps = int(keras.ops.convert_to_numpy(self.optimizer.iterations))
            if not epoch * n <= steps <= (epoch + 1) * n:
                raise ValueError(
                    f"The backup in {backups[0].backup_dir!r} is of epoch {epoch}, but its "
                    f"optimizer has taken {steps} steps: expected {epoch * n} to "
                    f"{(epoch + 1) * n} at {n} steps an epoch. It was written by a run of "
                    f"another length (batch size, data) or another model; delete it to start "
                    f"afresh.")
            position = steps
        if position > epoch * n:
            kwargs = dict(kwargs, callbacks=list(callbacks) + [_StopAtStep(epochs * n)])
        raw, shuffle_batch_size = getattr(self, "_raw_training_data", None) or (None, None)
        preprocessor = getattr(self, "preprocessor", None)
        if raw is not None and hasattr(preprocessor, "prepare_epochs"):
            first, skip = divmod(position, n)
            epochs = _epochs_from(first, skip)
            x = preprocessor.prepare_epochs(raw, epochs, shuffle_batch_size=shuffle_batch_size,
                                            checked=ds is None)
            return self._checked_features(self._drop_unused_features(x)), kwargs
        if position == 0 and ds is not None:
            return ds, kwargs
        if raw is not None and getattr(preprocessor, "prepares_batch_by_batch", False):
            raw = raw.repeat()
            x = preprocessor.prepare(raw.skip(position) if position else raw, training=True)
            return self._checked_features(self._drop_unused_features(x)), kwargs
        return ds.skip(position), kwargs

    def _epoch_keyed(self, ds, kwargs):
        """A dataset of unknown length (sentence pairs or blocks cut from documents, a corpus
        stream), read so that a fit that starts at epoch k, batch b reads what the
        uninterrupted run read there.

        Keras opens a new iterator on such a dataset every epoch. A pretraining preprocessor's
        pipeline (`prepare_epochs`: everything drawn from its seed and the epoch) is built and
        opened once, from the run's epoch and the batches to skip to its last epoch, and each
        of Keras' iterators reads its next epoch (`_epoch_reader`); under a strategy, and on
        JAX and torch (whose trainers read a first batch to build the model: it would be lost
        to the epoch), each iterator builds its epoch's pipeline from the epoch and the batches
        to skip that `_EpochPosition` sets at the epoch's start. Any other dataset (a
        fine-tuning preprocessor's, model inputs) is read again, less the batches to skip.

        The skip is the resumed epoch's steps done: the restored optimizer's step count less
        the step at which that epoch began (`_epoch_record`, saved with every backup and
        checkpoint). Every epoch is read to its end: after a fit's first epoch Keras reads at
        most one batch more than that epoch had (then opens, and never reads, one more
        iterator), so longer epochs were cut short, and differently in a resumed run.

        `ds` is None where `_prepare` built no pipeline (`_EpochKeyedData`: a pretraining
        preprocessor's raw data, checked): the pipeline built here is the fit's only one."""
        callbacks = _callback_list(kwargs)
        backups = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
        epoch = self._initial_epoch or kwargs.get("initial_epoch", 0) or 0
        skip = 0
        if backups and self._initial_epoch is not None:
            steps = int(keras.ops.convert_to_numpy(self.optimizer.iterations))
            record = getattr(self, "_loaded_epoch_record", None)
            where = backups[0].backup_dir
            if record is None:
                raise ValueError(
                    f"The backup in {where!r} does not say at which step its epoch {epoch} "
                    f"began (it was not written by a keras_bertfam task's fit on data of unknown "
                    f"length), so where to resume in that epoch is unknown. Delete it to start "
                    f"afresh.")
            recorded_epoch, start = record
            if recorded_epoch == epoch - 1:  # written at the end of the epoch before
                start = steps
            elif recorded_epoch != epoch or not 0 <= steps - start:
                raise ValueError(
                    f"The backup in {where!r} is of epoch {epoch} at step {steps}, but records "
                    f"epoch {recorded_epoch} begun at step {start}: it was written by another "
                    f"run. Delete it to start afresh.")
            skip = steps - start
        state = tf.Variable([epoch, skip], dtype=tf.int64, trainable=False)
        epochs = tf.data.Dataset.from_tensors(0).map(
            no_autograph(lambda _: tf.unstack(state.read_value())))
        raw, shuffle_batch_size = getattr(self, "_raw_training_data", None) or (None, None)
        keyed = raw is not None and hasattr(getattr(self, "preprocessor", None),
                                            "prepare_epochs")
        if not keyed:
            raw = ds
        for _ in range(epoch):
            # The input's own reshuffling (`read_corpus(shuffle_files=True)`, a dataset's
            # `shuffle(reshuffle_each_iteration=True)`) draws its order when an iterator opens:
            # the uninterrupted run had opened one an epoch before epoch k.
            iter(raw)
        # One pipeline for the whole fit, read an epoch at a time (`_epoch_reader`), where no
        # batch is read to build the model: on TensorFlow without a strategy
        # (`_maybe_symbolic_build` builds from the spec; JAX's and torch's trainers read one).
        one_run = keyed and keras.backend.backend() == "tensorflow" and \
            self._distribute_strategy is None
        if one_run:
            epochs = _epochs_from(epoch, skip, kwargs.get("epochs", 1))
        if keyed:
            x = self.preprocessor.prepare_epochs(raw, epochs,
                                                 shuffle_batch_size=shuffle_batch_size,
                                                 checked=ds is None, end_marks=one_run)
            x = _epoch_reader(x) if one_run else x
            x = self._checked_features(self._drop_unused_features(x))
        else:
            x = epochs.flat_map(no_autograph(lambda _, skip: ds.skip(skip)))
        position = _EpochPosition(self, state, epoch, skip)
        object.__setattr__(self, "_capture_epoch_iterator", True)
        return x, dict(kwargs, callbacks=[position] + callbacks)

    def _no_training_step_message(self):
        """fit's data gave no batch at all (Keras then returns an empty history, silently)."""
        message = (f"{type(self).__name__}.fit ran no training step: the data gave no batch, "
                   "so nothing was trained.")
        hint = getattr(getattr(self, "preprocessor", None), "no_batch_hint", None)
        hint = hint() if hint is not None else None
        message += " " + (hint or "Check that the dataset is not empty.")
        return message

    def make_train_function(self, force=False):
        """Creates the optimizer's slots before the train step is traced: every path into
        training (`fit`, `train_on_batch`, the CLI's direct `keras.Model.fit`) comes here first.

        Without a distribution strategy, Keras on TensorFlow defers the slots to the first trace,
        where each slot's initializer becomes a `tf.cond` and the step is traced twice: a tiny
        model's first `fit` step took 23 s instead of 8. Under a strategy, and on JAX and torch,
        Keras builds them before tracing itself.

        The preprocessor's layers do not count: they run in `tf.data`, never in the step, and
        may never be built (the QuestionAnswerer's tokenizer is only used through
        `tokenize_with_offsets`, which left its first `fit` tracing the step twice).
        """
        if (keras.backend.backend() == "tensorflow"
                and not getattr(self, "_distribute_strategy", None)
                and self.optimizer is not None and not self.optimizer.built and self.built
                and _model_layers_built(self)):
            self.optimizer.build(self.trainable_variables)
        # The auto schedule's steps are constants of the traced step: a step traced before a
        # fit filled them (or before a failed fit's were undone, `_unfill_schedule`) is traced
        # again if they differ now, and kept if they are the same.
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)  # (loss scaling)
        schedule = getattr(optimizer, "_learning_rate", None)
        steps = ((schedule.total_steps, schedule.warmup_steps)
                 if isinstance(schedule, WarmupLinearDecay) else None)
        if steps != self.__dict__.get("_traced_schedule_steps"):
            force = True
        object.__setattr__(self, "_traced_schedule_steps", steps)
        return super().make_train_function(force=force)

    @carries_tf_errors
    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
        if not self.compiled:
            self.compile()
        if kwargs.get("_use_cached_eval_dataset"):
            # fit()'s validation: its data was prepared by our fit already.
            return super().evaluate(x=x, y=y, batch_size=batch_size,
                                    sample_weight=sample_weight, **kwargs)
        self._check_labels_given(x, y, "evaluate")
        x, y, sample_weight, batch_size = self._prepare(x, y, sample_weight, batch_size,
                                                        training=False)
        x, kwargs = one_iterator(x, kwargs, "steps", every=self._steps_per_execution())
        with self._variables_restored_on_error(), warnings.catch_warnings():
            _read_once(x, kwargs.get("steps"))  # (QuestionAnswerer's windows)
            return super().evaluate(x=without_autotune_model(x), y=y, batch_size=batch_size,
                                    sample_weight=sample_weight, **kwargs)

    @carries_tf_errors
    def predict(self, x=None, batch_size=None, **kwargs):
        x, _, _, batch_size = self._prepare(x, batch_size=batch_size, training=False)
        if isinstance(x, tf.data.Dataset):
            x, kwargs = one_iterator(x.map(no_autograph(lambda *data: data[0])), kwargs, "steps",
                                     every=self._steps_per_execution())
        elif (isinstance(x, dict) and "padding_mask" in x and set(kwargs) <= {"verbose"}
              and keras.backend.backend() != "jax"  # JAX would compile once per length
              and getattr(self.preprocessor, "dynamic_padding", False)):
            return self._predict_by_length(x, batch_size or 32, kwargs.get("verbose", "auto"))
        with self._variables_restored_on_error(), warnings.catch_warnings():
            _read_once(x, kwargs.get("steps"))
            return super().predict(x=without_autotune_model(x), batch_size=batch_size, **kwargs)

    # A batch at a time (keras-hub's `*_on_batch`): model inputs get the same check as every
    # other route (JAX's traced step cannot raise: a Longformer row over its global cap would
    # give NaN there); raw examples go through the preprocessor (`_batch_inputs`).
    @carries_tf_errors
    def train_on_batch(self, x, y=None, sample_weight=None, *args, **kwargs):
        if not self.compiled:
            self.compile()  # the task's defaults, as `fit`
        x, y, sample_weight = self._batch_inputs(x, y, sample_weight)
        return super().train_on_batch(x, y, sample_weight, *args, **kwargs)

    @carries_tf_errors
    def test_on_batch(self, x, y=None, sample_weight=None, *args, **kwargs):
        if not self.compiled:
            self.compile()
        x, y, sample_weight = self._batch_inputs(x, y, sample_weight)
        return super().test_on_batch(x, y, sample_weight, *args, **kwargs)

    @carries_tf_errors
    def predict_on_batch(self, x):
        return super().predict_on_batch(self._batch_inputs(x)[0])

    def _batch_inputs(self, x, y=None, sample_weight=None):
        """A `*_on_batch` call's inputs: raw examples (texts, pairs) go through a fine-tuning
        task's preprocessor in memory, as keras-hub's `*_on_batch` preprocess them (ours gave
        Keras' input error), with `evaluate`'s checks; model inputs are checked as they are."""
        check_labels_not_a_dict(self, x, y)
        if not isinstance(x, dict) and hasattr(getattr(self, "preprocessor", None),
                                               "call_in_memory"):
            x, y, sample_weight, _ = self._prepare(x, y, sample_weight, training=False)
            return x, y, sample_weight
        return self._checked_model_inputs(x, y), y, sample_weight

    def _predict_by_length(self, x, batch_size, verbose):
        """In-memory inputs with dynamic padding: batches of similar lengths, each cut to its
        longest, predicted in that order and returned in the caller's (the whole array would be
        padded to its longest row: ~2.3x the work on the Rotten Tomatoes sentences)."""
        lengths = np.asarray(x["padding_mask"]).astype(bool).sum(axis=1)
        order = np.argsort(-lengths, kind="stable")
        starts = range(0, len(order), batch_size)
        bar = keras.utils.Progbar(len(starts)) if verbose not in (0, "silent") else None
        outputs = []
        for i, start in enumerate(starts):
            rows = order[start:start + batch_size]
            width = max(int(lengths[rows].max()), 1)
            cut = slice(-width, None) if self.preprocessor.padding_side == "left" else \
                slice(width)
            outputs.append(self.predict_on_batch({k: np.asarray(v)[rows, cut]
                                                  for k, v in x.items()}))
            if bar is not None:
                bar.update(i + 1)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return tree.map_structure(lambda *parts: np.concatenate(parts)[inverse], *outputs)

    # === Config ===
    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable}
        for name, param in inspect.signature(type(self).__init__).parameters.items():
            if name in ("self", "kwargs") or param.kind == param.VAR_KEYWORD:
                continue
            value = getattr(self, name)
            if isinstance(value, keras.layers.Layer):
                value = keras.saving.serialize_keras_object(value)
            config[name] = value
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key, value in config.items():
            if isinstance(value, dict) and "class_name" in value:
                config[key] = keras.saving.deserialize_keras_object(value)
        # Setting a model's `trainable` sets every sublayer's: a task's trainable=True passed to
        # the constructor unfroze a frozen backbone (`backbone.trainable = False`) on JAX and
        # torch, after load_model or from_config. The sublayers' configs keep their own.
        trainable = config.pop("trainable", True)
        task = cls(**config)
        if not trainable:
            task.trainable = False
        return task

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """A task on a preset's backbone (and its tokenizer as the preprocessor's)."""
        return preset_hooks.call("load_task", cls, preset, load_weights=load_weights, **kwargs)

    def save_to_preset(self, preset_dir):
        preset_hooks.call("save_task", self, preset_dir)


# What keras.Model's functional constructor takes from a task's keyword arguments; it drops
# anything else without a word (a misspelled `num_clases=3` built 2 classes).
_MODEL_KWARGS = ("inputs", "outputs", "name", "trainable")


def _check_model_kwargs(task, kwargs):
    """A task's keyword arguments left for keras.Model: `dtype` (keras-hub's: the task's layers
    follow its backbone's policy, so it must be the backbone's; `from_preset(..., dtype=)` builds
    the backbone with it), and nothing unknown."""
    dtype = kwargs.pop("dtype", None)
    if dtype is not None:
        policy, own = keras.dtype_policies.get(dtype), task.backbone.dtype_policy
        if policy.name != own.name:
            raise ValueError(
                f"{type(task).__name__}(dtype={dtype!r}): a task's dtype policy is its "
                f"backbone's dtype policy, {own.name!r}; build the backbone with dtype="
                f"{policy.name!r} (from_preset(..., dtype={policy.name!r}) does).")
    unknown = sorted(k for k in kwargs if k not in _MODEL_KWARGS)
    if unknown:
        own = [n for n in inspect.signature(type(task).__init__).parameters
               if n not in ("self", "kwargs")]
        hint = (" (the task returns logits; keras-hub's activation= is a TextClassifier's: apply "
                "keras.activations.softmax to this task's predictions)"
                if "activation" in unknown else "")
        raise TypeError(f"{type(task).__name__} got unexpected keyword argument(s) {unknown}"
                        f"{hint}; it takes {own + ['dtype', 'name']}.")


# The file in a BackupAndRestore directory that records the run the backup belongs to.
RUN_FILE = "keras_bertfam_run.json"


def _callback_list(kwargs):
    callbacks = kwargs.get("callbacks") or []
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    return list(callbacks)


def _without_names(config):
    """A config without its objects' `name`s (Keras numbers them per process: masked_lm_1)."""
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def _differences(saved, current, where=""):
    """The paths where two JSON values differ, with both values (short)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        found = []
        for key in list(current) + [k for k in saved if k not in current]:
            found += _differences(saved.get(key), current.get(key),
                                  f"{where}.{key}" if where else str(key))
        return found
    if saved != current:
        return [f"{where or 'the run'}: {str(saved)[:60]} != {str(current)[:60]}"]
    return []


def _global_torch_random_state_kept():
    """On PyTorch, torch's global random state as it was before a fit, after it (each train step
    seeds it: `Task.train_step`); elsewhere nothing."""
    if keras.backend.backend() != "torch":
        return contextlib.nullcontext()
    import torch

    return torch.random.fork_rng()


class _EpochKeyedData:
    """A pretraining preprocessor's raw training data (or a fine-tuning one's, mapped batch by
    batch, of known length), checked and kept for `fit` (`Task._prepare(...,
    epoch_keyed=True)`), its pipeline not built yet: `steps`, the batches an epoch gives, where
    known before the pipeline is built and read, else None."""

    def __init__(self, steps):
        self.steps = steps


def _epochs_from(first, skip, end=np.iinfo(np.int64).max):
    """The `(epoch, skip)` pairs of `prepare_epochs` from epoch `first` (less its first `skip`
    batches) to `end` (excluded)."""
    return tf.data.Dataset.range(first, max(first, end)).map(
        no_autograph(lambda e: (e, tf.where(e == first, tf.constant(skip, tf.int64), 0))))


def _epoch_reader(run):
    """A fit's one pipeline of every epoch (`prepare_epochs(end_marks=True)`), opened once,
    read an epoch at a time: Keras opens an iterator every epoch on a dataset of unknown
    length, and each opening of the pipeline itself instantiated every function of its
    tokenizer, pairer and masker again (ALBERT's SOP on 8 short documents: 0.57-0.70 s of CPU
    an epoch after the first, 0.04-0.05 s so; BUILD.md). Each iterator of this reads the
    pipeline's next batches up to the end of their epoch, the same batches."""
    iterator = iter(without_autotune_model(run))

    @tf.autograph.experimental.do_not_convert
    def read(_):
        return iterator.get_next()

    @tf.autograph.experimental.do_not_convert
    def before_the_end(end, batch):
        return tf.logical_not(end)

    @tf.autograph.experimental.do_not_convert
    def unmarked(end, batch):
        return batch

    return (tf.data.Dataset.from_tensors(0).repeat().map(read).take_while(before_the_end)
            .map(unmarked))


class _StopAtStep(keras.callbacks.Callback):
    """Ends training once the optimizer has taken `steps` steps (a run resumed mid-epoch)."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) >= self.steps:
            self.model.stop_training = True


class _EpochPosition(keras.callbacks.Callback):
    """The epoch (and, in the first, the batches to skip) an `_epoch_keyed` pipeline reads,
    set at each epoch's start; the task's `_epoch_record`; every epoch read to its end."""

    def __init__(self, task, state, first_epoch, skip):
        super().__init__()
        self.task, self.state, self.first_epoch, self.skip = task, state, first_epoch, skip

    def on_epoch_begin(self, epoch, logs=None):
        skip = self.skip if epoch == self.first_epoch else 0
        self.state.assign([epoch, skip])
        steps = int(keras.ops.convert_to_numpy(self.task.optimizer.iterations))
        object.__setattr__(self.task, "_epoch_record", (epoch, steps - skip))

    def on_epoch_end(self, epoch, logs=None):
        iterator = self.task.__dict__.get("_fit_epoch_iterator")
        if iterator is not None:
            # Keras caps the next epochs at this one's length (`EpochIterator._num_batches`).
            iterator._num_batches = None

    def on_train_end(self, logs=None):
        object.__setattr__(self.task, "_fit_epoch_iterator", None)


def check_backup_dir(path):
    """A `BackupAndRestore` directory the callback can write: an existing one that is not a
    directory or is read-only fails at the end of the first epoch in Keras (the epoch's
    training lost); refused before training."""
    path = str(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"BackupAndRestore's backup_dir {path!r} is a file; expected a "
                             f"directory (or a path that does not exist yet).")
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"BackupAndRestore's backup_dir {path!r} is not writable: "
                                  f"its backups would fail at the end of the first epoch.")


def _backbones(task):
    """The backbones a task runs (ELECTRA: generator and discriminator; Distiller: student and
    teacher)."""
    found = []
    for name in ("backbone", "discriminator", "generator", "student", "teacher"):
        value = task.__dict__.get(name)
        value = getattr(value, "backbone", value)  # Distiller's student is a task
        if value is not None and hasattr(value, "vocabulary_size") and value not in found:
            found.append(value)
    return found


def check_backbone_and_preprocessor(task):
    """When a task is built: its backbone's family (`backbone_families`), and that its
    preprocessor fits the backbone: every token id the tokenizer can emit has a row in the
    embedding table (JAX would gather out of range silently: NaN logits) and `sequence_length`
    is at most the backbone's `max_sequence_length` (a longer one fails later in a Slice)."""
    name = type(task).__name__
    backbones = _backbones(task)
    families = type(task).backbone_families
    for backbone in backbones[:1]:
        family = getattr(backbone, "family", None)
        if families and family not in families:
            raise ValueError(
                f"{name} trains a {' or '.join(repr(f) for f in families)} backbone; got a "
                f"{type(backbone).__name__} (family {family!r}). Load a preset of that family, "
                f"or use the task of the {family!r} family.")
    preprocessor = task.__dict__.get("preprocessor")
    if getattr(preprocessor, "xlnet_layout_supported", False) and backbones:
        layout = task.packing_layout
        called = {"xlnet": "XLNet", "bert": "BERT"}
        if preprocessor.layout not in ("auto", layout):
            raise ValueError(
                f"{name} on {type(backbones[0]).__name__} reads its rows packed in "
                f"{called[layout]}'s layout (layout={layout!r}), but "
                f"its {type(preprocessor).__name__} was built with layout="
                f"{preprocessor.layout!r}. Build it with layout='auto' (or {layout!r}).")
        attached = preprocessor.__dict__.get("_task_layout")
        if attached not in (None, layout):
            # One preprocessor packs one layout: the task it was given first would read rows
            # packed for this one.
            raise ValueError(
                f"This {type(preprocessor).__name__} already packs rows for a task that reads "
                f"{called[attached]}'s layout; {name} on {type(backbones[0]).__name__} reads "
                f"{called[layout]}'s."
                f" Give each task a preprocessor of its own.")
        preprocessor._task_layout = layout
    if isinstance(preprocessor, ReturnsModelInputs) and backbones:
        takes = [type(b).__name__ for b in backbones
                 if isinstance(b.input, dict) and "segment_ids" in b.input]
        if takes and preprocessor.segment_ids is False:
            raise ValueError(
                f"{name} on {takes[0]} reads `segment_ids`, but its {type(preprocessor).__name__}"
                f" was built with segment_ids=False (it returns none; zeros would stand for a "
                f"text pair's second segment). Build it with segment_ids='auto' (or True).")
        # x holds the inputs of the task's backbones: a user's model over `backbone.input`
        # matches them by position (`ReturnsModelInputs`). A preprocessor shared with a task
        # that reads them keeps returning them (a task drops what its model does not take).
        preprocessor._task_segment_ids = bool(takes) or bool(
            preprocessor.__dict__.get("_task_segment_ids"))
        # A task derives a Longformer's global attention in its graph (`backbone_inputs`): its
        # model inputs have no `global_attention_mask`.
        preprocessor._task_global_attention = False
    check_tokenizer_fits(getattr(preprocessor, "tokenizer", None), backbones)
    tables = [(b.max_sequence_length, type(b).__name__) for b in backbones
              if isinstance(getattr(b, "max_sequence_length", None), (int, np.integer))]
    if preprocessor is not None and tables:
        table = min(tables)  # the shortest table bounds every model the task runs
        check_fits_positions(getattr(preprocessor, "sequence_length", None), *table)
        preprocessor._position_table = table  # a `sequence_length` set later is checked then


def check_prepare_signature(task, preprocessor):
    """A preprocessor's `prepare` takes what `_prepare` passes it, `(ds, training=...,
    batch_size=...)`: a subclass overriding it as `prepare(self, ds, training=True)` (as before
    `batch_size`) failed inside `fit` with Python's "unexpected keyword argument 'batch_size'".
    Refused when the task is built with it or it is attached, naming its class and signature."""
    prepare = getattr(preprocessor, "prepare", None)
    if not callable(prepare):
        return
    try:
        signature = inspect.signature(prepare)
    except (TypeError, ValueError):  # no signature to read (a builtin): left to the call
        return

    def takes(**kwargs):
        try:
            signature.bind(None, **kwargs)
            return True
        except TypeError:
            return False

    if takes(training=True, batch_size=None):
        return
    refused = [f"{k}=" for k in ("training", "batch_size") if not takes(**{k: None})]
    raise TypeError(
        f"{type(task).__name__}: {type(preprocessor).__name__}.prepare{signature} does not "
        f"take {' or '.join(refused) or 'the arguments'}, which a task passes it: expected "
        f"prepare(ds, training=True, batch_size=None) (batch_size: the batch size given to "
        f"fit / evaluate / predict, None when none was; a preprocessor that keeps its "
        f"incoming batches ignores it).")


def check_tokenizer_fits(tokenizer, backbones, served=False):
    """Every token id `tokenizer` can emit has a row in each backbone's embedding table (JAX
    would gather out of range silently: NaN logits). `served`: the export's string signature,
    whose every request holding such an id would fail."""
    size = _vocabulary_size(tokenizer)
    if size is None:
        return
    for backbone in backbones:
        rows = getattr(backbone, "vocabulary_size", None)
        if isinstance(rows, (int, np.integer)) and size > rows:
            raise ValueError(
                f"The tokenizer's vocabulary has {size} tokens but {type(backbone).__name__}'s "
                f"embedding table has vocabulary_size={rows} rows: ids {rows}..{size - 1} have "
                f"no embedding" + (", and every request holding one would fail" if served else "")
                + f". Expected a tokenizer of at most {rows} tokens ("
                + ("the model's own: tokenizer=None" if served else
                   f"or a backbone built with vocabulary_size >= {size}") + ").")


def _vocabulary_size(tokenizer):
    """The tokenizer's vocabulary size; None before it has a vocabulary (a tokenizer restored
    from a `.keras` file gets its assets after the task is built)."""
    if tokenizer is None or not hasattr(tokenizer, "vocabulary_size"):
        return None
    try:
        return int(tokenizer.vocabulary_size())
    except (ValueError, AttributeError, TypeError):
        return None


def needs_global_attention_check(task):
    """Whether the task's backbone derives global attention for it in a bounded number of
    slots (a Longformer's `max_global_tokens`) that its inputs could overflow (QA's question,
    MultipleChoice's choice; a classifier's one `<s>` always fits)."""
    from keras_bertfam.models.longformer import TASK_GLOBAL_ATTENTION

    backbone = task.__dict__.get("backbone")
    return (getattr(backbone, "task_global_attention", None) is not None
            and getattr(backbone, "max_global_tokens", None) is not None
            and type(task).global_attention_task in TASK_GLOBAL_ATTENTION)


def _task_rows(features):
    """A task's model inputs as (rows, T) int32 TensorFlow tensors, as the task folds a
    multiple choice's (B, C, T): `token_ids`, `segment_ids` (zeros where missing),
    `padding_mask` (ones), and `global_attention_mask` where given."""
    token_ids = tf.convert_to_tensor(features["token_ids"])
    width = tf.shape(token_ids)[-1]

    def rows(key, default):
        value = features.get(key)
        value = default(token_ids) if value is None else tf.convert_to_tensor(value)
        return tf.reshape(tf.cast(value, tf.int32), [-1, width])

    flat = {"token_ids": rows("token_ids", tf.identity),
            "segment_ids": rows("segment_ids", tf.zeros_like),
            "padding_mask": rows("padding_mask", tf.ones_like)}
    if features.get("global_attention_mask") is not None:
        flat["global_attention_mask"] = rows("global_attention_mask", tf.zeros_like)
    return flat


def drop_derived_global_attention(task, features):
    """A Longformer task's model inputs without the `global_attention_mask` they were given (a
    preset's preprocessor gives one, the task's, for a model of one's own over
    `backbone.input`): the task derives its own in its graph (`task_global_attention`). One that
    differs from it would be ignored: the pipeline stops (eagerly: raises) with an
    InvalidArgumentError naming the first row and position where they differ."""
    if features.get("global_attention_mask") is None:
        return features
    name = type(task).global_attention_task
    flat = _task_rows(features)
    derived = task.backbone.task_global_attention(flat, name, xp=TF_OPS)
    differ = tf.where(tf.not_equal(flat.pop("global_attention_mask"), derived))
    message = (f"{type(task).__name__} puts its own global attention on its rows (the Longformer "
               f"backbone's task_global_attention for {name!r}); got a global_attention_mask "
               f"that differs from it in row {{}} at position {{}}. Drop the "
               f"global_attention_mask (a preprocessor attached to the task gives none), or for "
               f"other global attention use a model of your own over backbone.input.")
    token_ids = _assert_then(tf.convert_to_tensor(features["token_ids"]),
                             tf.equal(tf.size(differ), 0), message, differ[:1, 0],
                             _first_or_zero(differ[:1, 1]))
    kept = {k: v for k, v in features.items() if k != "global_attention_mask"}
    if isinstance(features["token_ids"], tf.Tensor):
        kept["token_ids"] = token_ids
    return kept


def check_global_attention(task, features):
    """The task's model inputs (TensorFlow tensors, in `tf.data` or eager; or arrays), once no
    row has more global tokens than its Longformer backbone's `max_global_tokens`: the global
    attention the task's graph will derive (`task_global_attention`, the same rule in
    TensorFlow's ops), counted per row (MultipleChoice: per choice). Else the pipeline stops
    (eagerly: raises) with an InvalidArgumentError naming the row's count, the cap and how to
    get fewer (shorter choices or questions, or a larger `max_global_tokens`).

    The check runs before the model, on every backend: a traced step cannot raise on JAX, and
    an overflowing row would turn the loss NaN there (see `LongformerSelfAttention`)."""
    from keras_bertfam.models.longformer import TASK_GLOBAL_ATTENTION, TASK_TOO_MANY_GLOBAL_TOKENS

    backbone = task.backbone
    name = type(task).global_attention_task
    limit = int(backbone.max_global_tokens)
    token_ids = tf.convert_to_tensor(features["token_ids"])
    flat = _task_rows(features)
    flat.pop("global_attention_mask", None)
    counts = tf.reduce_sum(backbone.task_global_attention(flat, name, xp=TF_OPS), axis=1)
    bad = counts > limit
    message = TASK_TOO_MANY_GLOBAL_TOKENS.format(task=name, limit=limit,
                                                 where=TASK_GLOBAL_ATTENTION[name])
    checked = _assert_then(token_ids, tf.logical_not(tf.reduce_any(bad)), message,
                           tf.boolean_mask(counts, bad)[:1])
    if isinstance(features["token_ids"], tf.Tensor):
        return dict(features, token_ids=checked)
    return features


def batched_examples(examples, batch_size, shuffle=False):
    """In-memory raw examples -> a dataset of batches of `batch_size` (ragged where they are),
    in a new order every epoch with `shuffle` (the global seed makes it repeatable)."""
    ds = tf.data.Dataset.from_tensor_slices(examples)
    if shuffle:
        ds = ds.shuffle(int(ds.cardinality()), reshuffle_each_iteration=True)
    ragged = any(isinstance(s, tf.RaggedTensorSpec) for s in tf.nest.flatten(ds.element_spec))
    return ds.ragged_batch(batch_size) if ragged else ds.batch(batch_size)


def one_iterator(ds, kwargs, steps="steps_per_epoch", every=1):
    """A dataset of known length n (as our preprocessors make), repeated, with `steps=n` in
    Keras' `kwargs` (`steps_per_epoch` of fit, `validation_steps`, `steps` of evaluate and
    predict): Keras then opens one iterator per fit (per evaluation) and reads n batches from
    it. Given the finite dataset it opens a new iterator every epoch and one more at the end
    that is never read: each instantiates the preprocessing graph again (0.3-1 s for a
    tokenizing pipeline) and refills the shuffle and length-grouping buffers. The batches are
    the same (each repetition of a shuffled dataset reshuffles, as each new iterator did).

    Not when `every` (the model's `steps_per_execution`) does not divide n: Keras runs whole
    executions of `every` steps on a repeated dataset, so the epoch's last one read the next
    epoch's batches (5 batches, steps_per_execution=2: 6 optimizer steps, evaluation and
    predictions over 6); a finite dataset ends it where the data ends, as for arrays."""
    if not isinstance(ds, tf.data.Dataset) or kwargs.get(steps) is not None:
        return ds, kwargs
    n = int(ds.cardinality())
    if n <= 0 or n % max(int(every), 1):  # unknown (a stream) or infinite; or see above
        return ds, kwargs
    return ds.repeat(), dict(kwargs, **{steps: n})


def _read_once(ds, steps):
    """Inside `warnings.catch_warnings()`: a dataset read once without a number of steps (an
    unknown length: `one_iterator` gives a known one its steps), e.g. a corpus stream, or
    QuestionAnswerer's windows (each example's count known only once tokenized), ends when
    Keras runs out of data, where it warns "Your input ran out of data; interrupting training"
    though nothing was cut short: that warning is ignored. With `steps` given it stays (the
    data may well be shorter than asked)."""
    if isinstance(ds, tf.data.Dataset) and steps is None:
        warnings.filterwarnings("ignore", message="Your input ran out of data")


def without_autotune_model(ds):
    """`ds` without tf.data's autotuning model thread, unless its options set
    `autotune.enabled` themselves.

    On TensorFlow 2.21 deleting an iterator whose model thread has run for a while waits for
    that thread's next wake-up: the thread sleeps between optimizations for a period that
    doubles up to 60 s, and the deletion (holding the GIL) waits out the sleep. A `fit` of 41 s
    spent 16.9 s after its last callback deleting its iterator; an iterator 25 s old took 15.9 s
    to delete, 0.00 s without the model thread (BUILD.md). Without it, `num_parallel_calls` and
    prefetch buffers of `AUTOTUNE` keep TensorFlow's defaults (the cores for parallel maps, a
    prefetch buffer that grows as it is drained); the pretraining pipelines ran 12-20% faster
    on 2 cores so."""
    if not isinstance(ds, tf.data.Dataset) or ds.options().autotune.enabled is not None:
        return ds
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def check_batch_size(batch_size):
    """A positive int (a NumPy integer becomes an int: torch's sampler refuses np.int64) or
    None."""
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or (
            batch_size < 1):
        raise ValueError(f"batch_size must be a positive int (or None for 32), got "
                         f"{batch_size!r}.")
    return int(batch_size)


def _id_tables(task):
    """The embedding tables a task's id inputs index: [(input name, rows, what bounds it)]:
    `token_ids` by the backbone's `vocabulary_size`; `segment_ids` by its `num_segments` where
    it has a segment embedding (not RoBERTa, DistilBERT, XLNet: its segment ids are compared,
    not looked up)."""
    backbone = getattr(task, "backbone", None)
    tables = []
    size = getattr(backbone, "vocabulary_size", None)
    if isinstance(size, (int, np.integer)) and size > 0:
        tables.append(("token_ids", int(size), "vocabulary_size"))
    segments = getattr(backbone, "num_segments", None)
    if isinstance(segments, (int, np.integer)) and segments > 0 and getattr(
            backbone, "takes_segment_ids", False):
        tables.append(("segment_ids", int(segments), "num_segments"))
    return tables


def _id_range(task, size, bound):
    """How a wrong id's error ends: the valid range and what sets it."""
    return f"expected ids in [0, {size}) ({type(task.backbone).__name__}'s {bound})."


# Model inputs that are positions in the rows: a MaskedLM's predicted slots, and SpanBERT's
# first and last token of each slot's span (gathered clipped on JAX: a NaN or silently wrong
# loss; SpanBERT's out-of-row boundaries weighted the slot out of the SBO loss, silently).
POSITION_INPUTS = ("mask_positions", "span_starts", "span_ends")
_SPAN_ORDER = ("expected span_starts <= mask_positions <= span_ends (each slot's span holds its "
               "position, as SpanMasker(..., return_span_boundaries=True) makes them).")


def check_ids(task, features):
    """A dataset's model inputs (TensorFlow tensors in `tf.data`), once every token id is in
    [0, the backbone's `vocabulary_size`) and every segment id in [0, `num_segments`) where it
    has a segment embedding (`_id_tables`); else the pipeline stops with an error naming the
    first id out of range, its position in the batch and the valid range. On TensorFlow the
    embedding gather failed with its own message; on JAX and on GPUs it does not fail at all
    (an out-of-range gather is clamped or filled: a silently wrong answer), so the check is
    here, in the input pipeline, on every backend. A batch costs the ids' minimum and maximum;
    the first wrong id is looked for only where there is one.

    Masks (`MASK_INPUTS`: every family's padding_mask, a Longformer's global_attention_mask)
    hold 0 and 1 only: else the pipeline stops naming the first other value and its position
    (`mask_expected`; a Longformer refuses them in its TensorFlow graph, but a JAX step cannot
    raise; every family read a nonzero value as 1)."""
    name = type(task).__name__
    checked = dict(features)
    for key, size, bound in _id_tables(task):
        ids = features.get(key)
        if isinstance(ids, tf.Tensor):
            checked[key] = _checked_in_range(ids, size, f"{name} got {key}", key,
                                             _id_range(task, size, bound))
    for key in MASK_INPUTS:
        mask = features.get(key)
        if isinstance(mask, tf.Tensor) and (mask.dtype.is_integer or mask.dtype.is_floating):
            wrong = tf.logical_and(tf.not_equal(mask, 0), tf.not_equal(mask, 1))
            checked[key] = _checked_where(mask, tf.logical_not(tf.reduce_any(wrong)),
                                          lambda wrong=wrong: wrong, f"{name} got {key}", key,
                                          mask_expected(key, takes_global_attention(task)))
    ids = checked.get("token_ids")
    if isinstance(ids, tf.Tensor) and ids.shape.rank is not None and ids.shape.rank >= 2:
        # rows longer than the position table (a JAX or torch slice error, deep in the model),
        # MaskedLM's mask_positions outside the row (gathered clamped on JAX: NaN losses) and
        # SpanBERT's span boundaries outside the row or not around their slot's position
        length = tf.shape(ids, out_type=tf.int64)[-1]
        max_length = getattr(task.backbone, "max_sequence_length", None)
        if isinstance(max_length, (int, np.integer)) and max_length > 0:
            checked["token_ids"] = _assert_then(
                ids, length <= max_length, f"{name} got token_ids of {{}} positions in a batch: "
                f"{type(task.backbone).__name__} takes at most max_sequence_length={max_length} "
                "(its position table).", tf.reshape(length, [1]))
        for key in POSITION_INPUTS:
            positions = features.get(key)
            if isinstance(positions, tf.Tensor) and positions.dtype.is_integer:
                wide = tf.cast(positions, tf.int64)  # (none: min is int64's max, max its min)
                low, high = tf.reduce_min(wide), tf.reduce_max(wide)
                checked[key] = _assert_then(
                    positions, (low >= 0) & (high < length), f"{name} got {key} from {{}} "
                    "to {} in a batch of rows of {} positions: expected positions in [0, the "
                    "rows' length).", tf.reshape(low, [1]), high, length)
        spans = [checked.get(key) for key in POSITION_INPUTS]
        if all(isinstance(v, tf.Tensor) and v.dtype.is_integer for v in spans):
            checked["mask_positions"] = _checked_spans(*spans, name)
    return checked


def _checked_spans(positions, starts, ends, name):
    """A batch's `mask_positions` (in `tf.data`) once every slot's span holds it (`span_starts`
    <= `mask_positions` <= `span_ends`), else the pipeline stops naming the first slot that
    does not (`_check_spans_in_memory`'s message, "of a batch")."""
    positions_, starts, ends = (tf.cast(v, tf.int64) for v in (positions, starts, ends))
    outside = (starts > positions_) | (positions_ > ends)

    def refuse():  # built only where a slot is outside its span
        first = tf.where(outside)[:1]
        index = tf.unstack(first[0]) if positions.shape.rank else []
        where = ", ".join(["{}"] * len(index))
        return _assert_then(
            positions, tf.constant(False), f"{name} got a span from {{}} to {{}} for "
            f"mask_positions {{}} at [{where}] of a batch: {_SPAN_ORDER}",
            tf.gather_nd(starts, first), tf.gather_nd(ends, first)[0],
            tf.gather_nd(positions_, first)[0], *index)

    return tf.cond(tf.reduce_any(outside), refuse, lambda: tf.identity(positions))


def _checked_in_range(ids, size, what, key, expected):
    """`ids` (a tensor in `tf.data`) once every one is in [0, size); else the pipeline stops
    with "<what> <the first id out of range> at <key>[<its position>] of a batch: <expected>"
    (`_checked_where`). A batch costs the ids' minimum and maximum; the first wrong id is
    looked for only where there is one. Ids of another dtype pass (Keras' input check names
    it)."""
    if not (ids.dtype.is_integer or ids.dtype.is_floating):
        return ids
    limit = tf.cast(size, ids.dtype)
    in_range = tf.logical_and(tf.reduce_min(ids) >= 0, tf.reduce_max(ids) < limit)
    return _checked_where(ids, in_range, lambda: tf.logical_or(ids < 0, ids >= limit), what,
                          key, expected)


def _checked_where(values, ok, wrong, what, key, expected):
    """`values` (a tensor in `tf.data`) once the scalar `ok` holds; else the pipeline stops with
    "<what> <the first wrong value> at <key>[<its position>] of a batch: <expected>", the
    wrong values being where `wrong()` (built only then) holds."""
    def refuse():
        first = tf.where(wrong())[:1]  # (1, rank)
        index = tf.unstack(first[0]) if values.shape.rank else []
        position = ", ".join(["{}"] * len(index))
        message = f"{what} {{}} at {key}[{position}] of a batch: " + expected
        return _assert_then(values, tf.constant(False), message, tf.gather_nd(values, first),
                            *index)

    return tf.cond(ok, lambda: tf.identity(values), refuse)


def _label_tables(task, y):
    """The label ids of `y` that index a table of the task's (its `label_id_tables()`: a
    MaskedLM's `mask_ids` the vocabulary, a pretrainer's `pair_labels` its two classes), as
    [(key, labels, size, what the error expects)]: a dict's entries by key, one array (or
    tensor, or spec) as the first table's. On JAX an out-of-range label is a clamped gather (a
    NaN or wrong loss, silently), on TensorFlow an error of the loss op's own."""
    tables = getattr(task, "label_id_tables", None)
    if tables is None or y is None:
        return []
    tables = tables()
    if isinstance(y, dict):
        return [(key, y[key], size, expected) for key, size, expected in tables
                if y.get(key) is not None]
    if not tables or isinstance(y, (tuple, list, str, bytes)):
        return []
    key, size, expected = tables[0]
    return [(key, y, size, expected)]


def check_label_ids(task, y):
    """A dataset's labels (`tf.data`: a tensor or a dict of them) once their label ids are in
    range (`_label_tables`), else the pipeline stops naming the first one out of range, its
    position in the batch and the valid range (as `check_ids` the inputs')."""
    name = type(task).__name__
    checked = dict(y) if isinstance(y, dict) else y
    for key, labels, size, expected in _label_tables(task, y):
        if isinstance(labels, tf.Tensor):
            labels = _checked_in_range(labels, size, f"{name} got label {key}", key, expected)
            if isinstance(checked, dict):
                checked[key] = labels
            else:
                checked = labels
    return checked


def _check_labels_in_memory(task, y):
    """In-memory labels (preprocessor=None): every label id in its table (`_label_tables`),
    else an error naming the first one out of range, its position and the valid range. The
    labels' minimum and maximum where they are; the position only where one is wrong."""
    name = type(task).__name__
    for key, labels, size, expected in _label_tables(task, y):
        labels, _ = numbers_in_memory(labels)
        if labels is None:
            continue
        low, high = min_max(labels)
        if low is None or (low >= 0 and high < size):  # (NaN: neither, so looked at)
            continue
        value, where = first_wrong(labels, lambda v: ~((v >= 0) & (v < size)))
        hint = (" A label to ignore takes weight 0 (sample_weight, mask_weights), not a "
                "negative id." if value < 0 else "")
        raise ValueError(f"{name} got label {key} {value} at {key}[{where}]: {expected}{hint}")


def _check_ids_in_memory(task, x):
    """In-memory model inputs (preprocessor=None): `token_ids` inside the backbone's vocabulary
    and no more positions than its position table, `segment_ids` inside its segment table
    (`_id_tables`). Either gave a TensorFlow "Graph execution error" from the embedding gather
    (and on JAX a silently clamped lookup). A dataset's are checked in its graph (`check_ids`).

    Cheap on every `*_on_batch` call: the shape first (no pass over the ids), then the ids'
    minimum and maximum where they are (a NumPy array read in place, a backend tensor reduced by
    its backend: two scalars come back), never a copy of the batch (it was converted to a new
    NumPy array each call)."""
    backbone = getattr(task, "backbone", None)
    if backbone is None:
        return
    name = type(task).__name__
    for key, size, bound in [("token_ids", None, None)] + _id_tables(task):
        ids = x.get(key)
        if ids is None or isinstance(ids, (tf.data.Dataset, str, bytes)):
            continue
        if isinstance(ids, (list, tuple)):
            try:  # Python lists: one array (Keras' data adapters make one too)
                ids = np.asarray(ids)
            except ValueError:  # ragged lists: checked where they are read
                continue
        shape, dtype = getattr(ids, "shape", None), getattr(ids, "dtype", None)
        if shape is None or dtype is None or len(shape) < 2 or 0 in tuple(shape):
            continue
        if size is None:  # the token ids' dtype and length, once
            _check_token_ids_shape(task, shape, dtype)
            continue
        low, high = min_max(ids)
        if low is not None and (low < 0 or high >= size):
            raise ValueError(f"{name} got {key} from {low} to {high}: "
                             + _id_range(task, size, bound))
    ids = x.get("token_ids")
    length = getattr(ids, "shape", (None,))[-1] if ids is not None else None
    if not isinstance(length, (int, np.integer)):
        return
    spans = {}
    for key in POSITION_INPUTS:  # MaskedLM's mask_positions, SpanBERT's span boundaries too
        positions = x.get(key)
        if positions is None or isinstance(positions, (tf.data.Dataset, str, bytes)):
            continue
        if isinstance(positions, (list, tuple)):
            positions = np.asarray(positions)
        if 0 not in tuple(getattr(positions, "shape", (0,))):
            low, high = min_max(positions)
            if low is not None and (low < 0 or high >= length):
                raise ValueError(f"{name} got {key} from {low} to {high} for rows of "
                                 f"{length} positions: expected positions in [0, {length}).")
            spans[key] = positions
    if len(spans) == len(POSITION_INPUTS):
        _check_spans_in_memory(name, *spans.values())


def _check_spans_in_memory(name, positions, starts, ends):
    """SpanBERT's in-memory inputs: every slot's span holds its position (`span_starts` <=
    `mask_positions` <= `span_ends`). A span ending before it starts was weighted out of the
    SBO loss silently; a position outside its span gave the SBO head another span's boundaries
    and an offset clipped to 0 (a wrong loss, silently). The two differences' minima where the
    values are; the first wrong slot looked for only where there is one."""
    try:
        low = min(min_max(positions - starts)[0], min_max(ends - positions)[0])
    except Exception:  # noqa: BLE001 - not in-memory arrays (symbolic, None): checked where read
        return
    if low >= 0:
        return
    positions, starts, ends = (np.asarray(keras.ops.convert_to_numpy(v)) for v in
                               (positions, starts, ends))
    index = tuple(int(i) for i in np.argwhere((starts > positions) | (positions > ends))[0])
    raise ValueError(f"{name} got a span from {starts[index]} to {ends[index]} for mask_positions "
                     f"{positions[index]} at [{', '.join(map(str, index))}]: {_SPAN_ORDER}")


def _check_token_ids_shape(task, shape, dtype):
    """In-memory `token_ids`: integer (or whole-number float) ids, no longer than the
    backbone's position table."""
    backbone = task.backbone
    try:
        dtype = keras.backend.standardize_dtype(dtype)
    except ValueError:
        dtype = str(dtype)
    name = type(task).__name__
    if not (dtype.startswith("int") or dtype.startswith("uint") or dtype.startswith("float")):
        raise ValueError(f"{name} got token_ids of dtype {dtype}: expected integer ids (or pass "
                         "raw text to a task with a preprocessor).")
    max_length = getattr(backbone, "max_sequence_length", None)
    if max_length and shape[-1] is not None and shape[-1] > max_length:
        raise ValueError(f"{name} got token_ids of {shape[-1]} positions: "
                         f"{type(backbone).__name__} takes at most max_sequence_length="
                         f"{max_length} (its position table).")


def _check_count(value, name, minimum):
    """fit's epochs (>= 1; Keras trained nothing for 0 or -1, silently, and raised "'float'
    object cannot be interpreted as an integer" for 2.5), initial_epoch, steps_per_epoch."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")


def check_raw_inputs(x, task_name, expected):
    """Raw inputs for a task with a preprocessor: a batch (a list, an array, a tuple of them or
    a dataset), not one string, not empty, not numbers where text is expected; not a dict or a
    table of columns (`check_text_batch`, naming them and `expected`, what the preprocessor
    takes: keras-hub's tasks take a dict of preprocessed features, raw text as a batch or a
    tuple of segments)."""
    if isinstance(x, (str, bytes)):
        raise ValueError(
            f"{task_name} takes a batch of examples, got a single string {x[:40]!r}: pass a list, "
            f"e.g. [{x[:20]!r}].")
    if x is None:
        raise ValueError(f"{task_name} got x=None: expected a list of strings, an array of "
                         "strings or a tf.data.Dataset.")
    if isinstance(x, tf.data.Dataset):
        return
    if isinstance(x, dict) or hasattr(x, "columns"):  # a pandas DataFrame
        check_text_batch(x, task_name, expected)
    check_not_an_iterator(x, "x", task_name)
    if isinstance(x, tuple) and not x:
        raise ValueError(f"{task_name} got an empty tuple: it takes {expected}.")
    parts = x if isinstance(x, tuple) else (x,)
    for i, part in enumerate(parts):
        if isinstance(part, (str, bytes)):
            raise ValueError(
                f"{task_name} reads a tuple as columns (e.g. (first_texts, second_texts)), each "
                f"a batch; got a tuple of strings {x!r:.80}. For a batch of texts pass a list.")
        if isinstance(part, tuple):  # (keras-hub's tuples are inputs apart, never a batch)
            raise ValueError(
                f"{task_name} reads a tuple as columns, each a batch; got column {i} as a tuple "
                f"{part!r:.60}: pass each column as a list or an array, e.g. list(column).")
        if isinstance(part, dict):
            continue
        if getattr(part, "ndim", None) == 0:
            raise ValueError(
                f"{task_name} takes a batch of examples, got a 0-d {type(part).__name__} "
                f"{part!r:.60}: pass a list or a 1-D array, e.g. [x.item()].")
        if isinstance(part, list) or (isinstance(part, np.ndarray) and part.dtype == object):
            _check_text_items(part, task_name)  # an object array: a pandas column
        if hasattr(part, "__len__") and len(part) == 0:
            raise ValueError(
                f"{task_name} got an empty input (0 examples, {type(part).__name__}): expected at "
                "least one string.")
        dtype = getattr(part, "dtype", None)
        if dtype is not None and _is_numeric(dtype):
            raise ValueError(
                f"{task_name} has a preprocessor, so it takes raw text; got an array of "
                f"{dtype} with shape {tuple(getattr(part, 'shape', ()))}. Pass strings, or "
                "build the task with preprocessor=None to feed token ids.")


def _check_text_items(texts, task_name):
    """A list of texts where some items are not: None, numbers (a missing value in a column, or
    a column of numbers: its first item is named)."""
    head = list(texts[:1000])
    if any(isinstance(t, (str, bytes)) for t in head) or not any(
            isinstance(t, (list, tuple, np.ndarray)) for t in head):
        check_text_items(texts, task_name)  # not lists of lists (words, choices): checked later


def check_not_an_iterator(values, name, task_name):
    """In-memory inputs are a batch that can be sliced: a generator, another one-pass iterator
    or a set (no order) is refused by name (TensorFlow's message was "Attempt to convert a
    value (<generator ...>) with an unsupported type")."""
    if isinstance(values, (set, frozenset)) or (
            hasattr(values, "__next__") and not isinstance(values, tf.data.Iterator)):
        kind = type(values).__name__
        raise ValueError(
            f"{task_name} got {name} as a {kind}: expected a list or an array (one entry per "
            f"example){', or a tf.data.Dataset' if name == 'x' else ''}. "
            + ("A set has no order: pass sorted(...) or a list." if kind in ("set", "frozenset")
               else "Pass list(...), or for a stream tf.data.Dataset.from_generator(...) "
                    "yielding (x, y) examples."))


def _has_labels(spec):
    """Whether a fine-tuning dataset's elements hold labels: a tuple whose parts are not all
    string tensors (a text pair without labels is two string tensors, as the preprocessors'
    `_split` reads it)."""
    if not isinstance(spec, tuple) or len(spec) < 2:
        return False
    return not all(isinstance(part, (tf.TensorSpec, tf.RaggedTensorSpec))
                   and part.dtype == tf.string for part in spec)


def _num_examples(x):
    """How many examples raw inputs hold, where that is plain: a list or array of texts, or a
    tuple of such columns (the first column's); None otherwise."""
    if isinstance(x, tuple):
        return _num_examples(x[0]) if x else None
    if isinstance(x, np.ndarray) and x.ndim >= 1:
        return len(x)
    if isinstance(x, list) and x and isinstance(x[0], (str, bytes)):
        return len(x)
    return None


def check_labels_not_a_dict(task, x, y):
    """A task whose labels are one array (`labels_are_one_array`) refuses `y` as a dict, in
    memory or as a dataset's labels, naming its keys (Keras' error was "Expected any non-tensor
    type, but got a tensor instead", the preprocessor's "Could not build a TypeSpec"; keras-hub's
    tasks take no dict either)."""
    check_not_an_iterator(y, "y", type(task).__name__)
    if not task.labels_are_one_array:
        return
    where = "y as a dict"
    if isinstance(x, tf.data.Dataset) and y is None:
        spec = x.element_spec
        y = spec[1] if isinstance(spec, tuple) and len(spec) > 1 else None
        where = "a dataset whose labels are a dict"
    if isinstance(y, dict):
        key = next(iter(y), "labels")
        fix = (f"map it to (x, labels), e.g. ds.map(lambda x, y: (x, y[{key!r}]))"
               if where.startswith("a dataset") else f"pass the array itself, e.g. y=y[{key!r}]")
        raise ValueError(
            f"{type(task).__name__} takes its labels as one array (one entry per example), got "
            f"{where} with keys {sorted(map(str, y))}: the task has one output; {fix}.")


def check_example_counts(x, y, sample_weight, task_name):
    """Columns, labels and sample weights of in-memory inputs hold the same number of examples
    (TensorFlow's message was "Dimensions 3 and 2 are not compatible")."""
    check_column_lengths(x, task_name)
    n = _num_examples(x)
    if n is None:
        return
    for name, values in (("y", y), ("sample_weight", sample_weight)):
        if getattr(values, "ndim", None) == 0:
            raise ValueError(f"{task_name} got {name} as a 0-d array ({values!r:.40}): {name} "
                             f"needs one entry per example ({n} here), e.g. a list or 1-D array.")
        counted = isinstance(values, list) or (isinstance(values, np.ndarray) and values.ndim)
        if counted and len(values) != n:
            raise ValueError(
                f"{task_name} got {n} example{'s' * (n != 1)} in x but {len(values)} in "
                f"{name}: {name} needs one entry per example.")


def check_sample_weights(sample_weight, task_name):
    """In-memory sample weights are finite, non-negative numbers. A NaN weight turned every
    weight of the model into NaN with no error; negative weights summing to zero made the
    weighted mean's loss -4e7; strings gave TensorFlow's "Graph execution error" at a Cast."""
    if sample_weight is None or not isinstance(sample_weight, (list, tuple, np.ndarray)):
        return
    try:
        flat = np.asarray(sample_weight).reshape(-1)
    except ValueError:  # ragged lists
        return
    if flat.dtype == object or not (np.issubdtype(flat.dtype, np.number) or
                                    flat.dtype == bool):
        items = flat.tolist()
        bad = next((v for v in items if not isinstance(v, (int, float))), items[0]) \
            if items else None
        raise ValueError(f"{task_name} got sample_weight {bad!r} ({type(bad).__name__}): "
                         f"expected numbers, one weight per example.")
    values = flat.astype("float64")
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"Invalid sample_weight {float(values[i])!r} (flat index {i}): expected finite, "
            f"non-negative weights (each scales its example's share of the loss's weighted "
            f"mean).")


def check_model_inputs(x, task_name):
    """Inputs for a task without a preprocessor: token ids, not text (Keras' own error for an
    array of strings is "Invalid dtype: str384")."""
    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        x = spec[0] if isinstance(spec, tuple) else spec
    parts = list(x.values()) if isinstance(x, dict) else list(x) if isinstance(x, tuple) else [x]
    for part in parts:
        if _is_text(part):
            raise ValueError(
                f"{task_name} has no preprocessor, so it takes token ids (a dict of `token_ids`, "
                f"`padding_mask`, ...); got text ({_describe(part)}). Build the task with "
                f"preprocessor={task_name}.default_preprocessor(tokenizer, backbone), or load "
                f"it with {task_name}.from_preset(...), which attaches one.")


def _is_text(part):
    if isinstance(part, (str, bytes)):
        return True
    if isinstance(part, list):  # its first leaf (a long list of id lists is not flattened)
        while isinstance(part, list) and part:
            part = part[0]
        return isinstance(part, (str, bytes))
    dtype = getattr(part, "dtype", None)
    if isinstance(dtype, tf.dtypes.DType):
        return dtype == tf.string
    if not isinstance(part, np.ndarray):
        return False
    return part.dtype.kind in "US" or (part.dtype.kind == "O" and part.size > 0 and isinstance(
        part.flat[0], (str, bytes)))


def _describe(part):
    if isinstance(part, (str, bytes)):
        return f"a single string {part[:40]!r}"
    if isinstance(part, list):
        return f"a list of {len(part)} strings"
    return f"{type(part).__name__} of strings with shape {tuple(part.shape)}"


def _is_numeric(dtype):
    if isinstance(dtype, tf.dtypes.DType):
        return dtype.is_floating or dtype.is_integer or dtype.is_bool
    try:
        return np.dtype(dtype).kind in "biufc"
    except TypeError:
        return False


def _arrays(data):
    """Python lists (also inside a dict or tuple) -> NumPy arrays; anything else unchanged."""
    if isinstance(data, list):
        return np.asarray(data)
    if isinstance(data, dict):
        return {k: _arrays(v) for k, v in data.items()}
    if isinstance(data, tuple):
        return tuple(_arrays(v) for v in data)
    return data


# The layers that run in `tf.data` only (preprocessors and their tokenizers, packers, maskers).
_DATA_LAYERS = (FinetuningPreprocessor, PretrainingPreprocessor, keras_hub.tokenizers.Tokenizer)


def _model_layers_built(task):
    """Whether every layer of the task is built, preprocessors' and tokenizers' aside: they run
    in `tf.data`, never in the model's steps, and a tokenizer used only through
    `tokenize_with_offsets` (the QuestionAnswerer's) is never "built". Any preprocessor the task
    tracks counts, not only the attached one: Keras keeps tracking a preprocessor replaced by
    `task.preprocessor = None` (or another), whose unbuilt tokenizer then made every first `fit`
    trace its step twice, the optimizer's slots under `tf.cond`s (MiniLM: 10 -> 33 s of CPU)."""
    outside = set()
    for layer in task._flatten_layers():
        if isinstance(layer, _DATA_LAYERS):
            outside.update(id(inner) for inner in layer._flatten_layers())
    return all(layer.built for layer in task._flatten_layers() if id(layer) not in outside)


def _scale_for_replicas(loss):
    """Each of N tf.distribute replicas returns loss / N: gradients are summed over replicas,
    so the step follows the mean of the replicas' losses (what Keras does for compiled losses).
    JAX's DataParallel computes one global loss already."""
    if keras.backend.backend() != "tensorflow":
        return loss
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss if replicas == 1 else loss * ops.cast(1.0 / replicas, loss.dtype)
