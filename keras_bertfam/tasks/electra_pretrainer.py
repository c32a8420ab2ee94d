"""ELECTRA pretraining: replaced-token detection (Clark et al. 2020).

A small generator (an MLM) fills the masked positions with samples; the discriminator labels every
token original or replaced. The corruption is two small pure functions, `gumbel_sample` and
`replace_at_positions`, that the model calls under stop-gradient.
"""
import keras
from keras import ops

from keras_bertfam import preset_hooks
from keras_bertfam.layers import ReplacedTokenHead
from keras_bertfam.models.backbone import head_initializer
from keras_bertfam.models.electra import ElectraBackbone
from keras_bertfam.tasks.losses import mlm_targets, weight_sum, weighted_sparse_ce
from keras_bertfam.tasks.masked_lm import (
    backbone_inputs,
    mask_id_table,
    masked_lm_head,
    masked_sequence,
    serving_mask_positions,
    serving_mlm_outputs,
)
from keras_bertfam.tasks.task import Task


# === Pure functions ===
def gumbel_sample(logits, seed=None, temperature=1.0):
    """One sample per row of `logits` (..., V) from softmax(logits / temperature), by Gumbel-max:
    `argmax(logits / T + g)`, g ~ Gumbel(0, 1) i.i.d. Returns int32 ids (...).

    `seed`: an int, or a `keras.random.SeedGenerator` (a new draw each call).
    """
    logits = ops.cast(logits, "float32")
    uniform = keras.random.uniform(ops.shape(logits), minval=0.0, maxval=1.0, seed=seed)
    gumbel = -ops.log(-ops.log(uniform + 1e-9) + 1e-9)
    return ops.cast(ops.argmax(logits / temperature + gumbel, axis=-1), "int32")


def replace_at_positions(token_ids, positions, values, weights=None):
    """`token_ids` (B, T) with `values` (B, P) written at `positions` (B, P).

    Slots with `weights` 0 (padding slots of keras-hub's format) are left alone; a position
    given in several weighted slots of a row (maskers never give one twice) takes the first
    one's value. Returns int32 (B, T).
    """
    token_ids = ops.cast(token_ids, "int32")
    length = ops.shape(token_ids)[1]
    hit = ops.one_hot(ops.cast(positions, "int32"), length, dtype="int32")  # (B, P, T)
    if weights is not None:
        hit = hit * ops.cast(ops.cast(weights, "bool"), "int32")[:, :, None]
    hit = hit * ops.cast(ops.cumsum(hit, axis=1) == 1, "int32")  # a position's first slot only
    written = ops.sum(hit, axis=1) > 0  # (B, T)
    new = ops.sum(hit * ops.cast(values, "int32")[:, :, None], axis=1)  # (B, T)
    return ops.where(written, new, token_ids)


def electra_generator(discriminator, generator_hidden_fraction=0.25, **overrides):
    """A generator for `discriminator` (ELECTRA's `get_generator_config`): same depth, vocabulary,
    positions and embedding width; hidden `round(H · fraction)`, heads `max(1, hidden // 64)`,
    intermediate 4 · hidden. The paper uses 1/4 for Small, 1/3 for Base and Large."""
    hidden = max(1, int(round(discriminator.hidden_dim * generator_hidden_fraction)))
    config = dict(
        vocabulary_size=discriminator.vocabulary_size,
        num_layers=discriminator.num_layers,
        num_heads=max(1, hidden // 64),
        hidden_dim=hidden,
        intermediate_dim=4 * hidden,
        embedding_dim=discriminator.embedding_dim,
        dropout=discriminator.dropout,
        max_sequence_length=discriminator.max_sequence_length,
        num_segments=discriminator.num_segments,
        layer_norm_epsilon=discriminator.layer_norm_epsilon,
        initializer_range=discriminator.initializer_range,
    )
    config.update(overrides)
    return ElectraBackbone(**config)


def share_embeddings(generator, discriminator):
    """Makes `generator` use the discriminator's token, position and segment tables and embedding
    LayerNorm (ELECTRA's tied embeddings); each keeps its own E -> H projection. In place."""
    source, target = discriminator.embeddings, generator.embeddings
    for name in ("token_embedding", "position_embedding", "segment_embedding", "layer_norm"):
        shared, own = getattr(source, name), getattr(target, name)
        if shared is own:
            continue
        if (shared is None) != (own is None) or (shared is not None and [
                tuple(w.shape) for w in shared.weights] != [tuple(w.shape) for w in own.weights]):
            raise ValueError(
                f"The generator's {name} does not match the discriminator's: ELECTRA shares them, "
                "so both need the same vocabulary_size, max_sequence_length, num_segments and "
                f"embedding_dim (generator {generator.embedding_dim}, discriminator "
                f"{discriminator.embedding_dim})."
            )
        if shared is None:
            continue
        # Swap the tracked sublayer so the old table leaves the generator's weights.
        target._tracker.replace_tracked_value("layers", own, shared)
        setattr(target, name, shared)


# === Layers ===
@keras.saving.register_keras_serializable(package="keras_bertfam")
class ReplacementSampler(keras.layers.Layer):
    """Samples the generator's replacements for the masked slots and writes them into the ids.

    Call args: `token_ids` (B, T), `mask_positions` (B, P), generator `logits` (B, P, V) ->
    (`discriminator_ids` (B, T), `sampled_ids` (B, P)). A slot at position 0 is a padding slot
    (keras-hub's format pads `mask_positions` with 0; position 0 holds [CLS], never masked).
    """

    def __init__(self, temperature=1.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.temperature = temperature
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.built = True

    def call(self, token_ids, mask_positions, logits):
        logits = ops.stop_gradient(logits)
        sampled = ops.stop_gradient(gumbel_sample(logits, self.seed_generator, self.temperature))
        ids = replace_at_positions(token_ids, mask_positions, sampled, mask_positions > 0)
        return ids, sampled

    def compute_output_spec(self, token_ids, mask_positions, logits):
        return (keras.KerasTensor(token_ids.shape, "int32"),
                keras.KerasTensor(mask_positions.shape, "int32"))

    def get_config(self):
        return dict(super().get_config(), temperature=self.temperature, seed=self.seed)


# === Task ===
@keras.saving.register_keras_serializable(package="keras_bertfam")
class ElectraPretrainer(Task):
    """ELECTRA's replaced-token detection (Clark et al. 2020): generator MLM + discriminator.

    The generator (an `ElectraBackbone` of `generator_hidden_fraction` of the discriminator's
    width, built by `electra_generator` when `generator=None`) shares the discriminator's token,
    position and segment tables and embedding LayerNorm; each has its own E -> H projection. Its
    MLM head (tied to the shared table) predicts the masked slots; a Gumbel-max sample
    (temperature 1, under stop-gradient) replaces each masked token; the discriminator's head
    `Dense(H, gelu) -> Dense(1)` labels every token `replaced = masked and sampled != original`
    (a correct sample counts as original).

    Loss: `MLM_gen + rtd_weight (50) · sigmoid CE` averaged over the non-pad tokens.

    `masked_rows_only=True` (the default): the generator's last layer runs at the
    `mask_positions` only, as `MaskedLM`'s (the same logits and gradients; in training, other
    dropout draws in that layer than `masked_rows_only=False`). The discriminator scores every
    token: it runs in full.

    Inputs: the discriminator's inputs + `mask_positions`; labels: keras-hub's format, `y =
    mask_ids`, `sample_weight = mask_weights` (or `y = {"mask_ids", "mask_weights"}`). ELECTRA
    masks 15% with 85% [MASK] / 15% unchanged / no random tokens: a masker with
    `mask_token_rate=0.85, random_token_rate=0.0` (the default preprocessor's).

    Outputs: `{"mlm_logits": (B, P, V), "sampled_ids": (B, P), "rtd_logits": (B, T),
    "mask_positions": (B, P), "padding_mask": (B, T)}` (the last two so that the loss can place
    the labels).

    After pretraining, `pretrainer.discriminator` is the backbone to fine-tune: `save_to_preset`
    saves it as the preset's backbone, with the generator, the heads and the task's arguments,
    which `ElectraPretrainer.from_preset` loads back.

    Export (`kb.export.export_saved_model`): `text` -> the discriminator's
    `replaced_probabilities` (B, T) (sigmoid of its head, 0 on padding) with the `token_ids` and
    `padding_mask` it scored (to align them with the client's tokens), and the generator's MLM
    top-k at the [MASK] tokens of the text (`mask_positions`, `mask_weights`, `mlm_top_ids`,
    `mlm_top_probabilities`, as `MaskedLM`'s). Nothing is sampled: the discriminator reads the
    text as given (HF `ElectraForPreTraining`), the generator fills its masks
    (`ElectraForMaskedLM`).

    Example:
    >>> disc = kb.models.ElectraBackbone(100, 2, 2, 32, 16, 64)  # doctest: +SKIP
    >>> model = kb.tasks.ElectraPretrainer(discriminator=disc)                  # doctest: +SKIP
    """

    serving_reads_mask_tokens = True

    backbone_argument = "discriminator"  # the backbone of its presets

    uses_pooled_output = False  # the pooler is not trained by this task

    def __init__(
        self,
        generator=None,
        discriminator=None,
        generator_hidden_fraction=0.25,
        rtd_weight=50.0,
        temperature=1.0,
        preprocessor=None,
        seed=None,
        masked_rows_only=True,
        **kwargs,
    ):
        if discriminator is None:
            raise ValueError("ElectraPretrainer needs a discriminator backbone.")
        if generator is None:
            generator = electra_generator(discriminator, generator_hidden_fraction)
        share_embeddings(generator, discriminator)
        self.generator = generator
        self.discriminator = discriminator
        self.generator_hidden_fraction = generator_hidden_fraction
        self.rtd_weight = rtd_weight
        self.temperature = temperature
        self.preprocessor = preprocessor
        self.seed = seed
        self.masked_rows_only = masked_rows_only
        initializer = head_initializer(discriminator)

        # === Layers ===
        self.mlm_head = masked_lm_head(generator, token_embedding=discriminator.token_embedding,
                                       name="generator_head")
        self.sampler = ReplacementSampler(temperature, seed=seed, name="sampler")
        self.rtd_head = ReplacedTokenHead(
            activation=getattr(discriminator, "activation", "gelu"),
            kernel_initializer=initializer,
            name="discriminator_head",
        )

        # === Functional model ===
        inputs, features = backbone_inputs(discriminator, extra=("mask_positions",))
        positions = inputs["mask_positions"]
        generated = masked_sequence(generator, {k: features[k] for k in generator.input},
                                    positions, masked_rows_only)["sequence_output"]  # (B, P, H)
        mlm_logits = self.mlm_head(generated)  # (B, P, V)
        corrupted, sampled = self.sampler(features["token_ids"], positions, mlm_logits)
        disc_sequence = discriminator(dict(features, token_ids=corrupted))["sequence_output"]
        outputs = {
            "mlm_logits": mlm_logits,
            "sampled_ids": sampled,
            "rtd_logits": self.rtd_head(disc_sequence),  # (B, T)
            "mask_positions": positions,
            "padding_mask": features["padding_mask"],
        }
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self._track_losses(["mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy"])

    @property
    def backbone(self):
        """The discriminator: the model ELECTRA pretraining produces."""
        return self.discriminator

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, masker=None,
                             seed=None, **kwargs):
        from keras_bertfam.preprocessing import MaskedLMPreprocessor
        from keras_bertfam.preprocessing.preprocessors import default_masker

        masker = masker or default_masker(tokenizer, sequence_length, seed=seed,
                                          mask_token_rate=0.85, random_token_rate=0.0)
        return MaskedLMPreprocessor(tokenizer, sequence_length, masker=masker, seed=seed,
                                    **kwargs)

    @classmethod
    def from_preset(cls, preset, load_weights=True, generator_preset=None,
                    preprocessor="default", **kwargs):
        """A pretrainer on a discriminator preset (e.g. "electra_small_discriminator_uncased_en"
        or a directory) and, optionally, a generator preset with the same embedding sizes;
        without one the generator is built at `generator_hidden_fraction` of the width, random
        (from an HF-format directory, a warning says so). HF checkpoints that have the heads
        (`ElectraForPreTraining`, `ElectraForMaskedLM`) give theirs. A preset an
        `ElectraPretrainer` saved gives its generator, heads and arguments back (unless
        `generator_preset` replaces its generator), as other tasks' presets."""
        if generator_preset is None and preset_hooks.call("get_loader", preset).saved_task(cls):
            return super().from_preset(preset, load_weights=load_weights,
                                       preprocessor=preprocessor, **kwargs)
        preprocessor_kwargs = {k: kwargs.pop(k) for k in list(kwargs)
                               if k in cls.preprocessor_args}
        tasks = []  # built before any weights are read (`built`): a bad argument fails first

        def build(discriminator, generator=None):
            made = preprocessor
            if made == "default":
                made = cls.default_preprocessor(preset_hooks.call("load_tokenizer", preset),
                                                discriminator, **preprocessor_kwargs)
            tasks.append(cls(generator=generator, discriminator=discriminator,
                             preprocessor=made, **kwargs))

        def with_generator(discriminator):  # the generator's weights are read first
            if generator_preset is None:
                return build(discriminator)
            preset_hooks.call("load_backbone", generator_preset, cls=ElectraBackbone,
                              load_weights=load_weights,
                              built=lambda generator: build(discriminator, generator))

        # Built and loaded as `Task.from_preset` does: no initial values drawn for what loads.
        with preset_hooks.call("deferred_initialization", load_weights):
            preset_hooks.call("load_backbone", preset, cls=ElectraBackbone,
                              load_weights=load_weights, built=with_generator)
            task = tasks[0]
            if load_weights:
                preset_hooks.call("load_hf_heads", task, preset, generator_preset=generator_preset)
        return task

    @classmethod
    def pretraining_task(cls, backbone, preprocessor):
        fraction = 0.25 if backbone.hidden_dim <= 256 else 1.0 / 3.0
        return cls(discriminator=backbone, generator_hidden_fraction=fraction,
                   preprocessor=preprocessor)

    def serving_features(self, features, special_token_ids):
        return serving_mask_positions(features, special_token_ids["mask"])

    def serving_call(self, inputs):
        # Inference runs the two models side by side on the input: no sampled replacements.
        features = {k: inputs[k] for k in self.discriminator.input}
        generated = self.generator({k: features[k] for k in self.generator.input},
                                   training=False)["sequence_output"]
        scored = self.discriminator(features, training=False)["sequence_output"]
        return {"mlm_logits": self.mlm_head(generated, inputs["mask_positions"]),
                "rtd_logits": self.rtd_head(scored)}

    def serving_outputs(self, features, outputs):
        tokens = ops.cast(features["padding_mask"], "float32")
        replaced = ops.sigmoid(ops.cast(outputs["rtd_logits"], "float32")) * tokens
        return dict(serving_mlm_outputs(features, outputs["mlm_logits"]),
                    replaced_probabilities=replaced, token_ids=features["token_ids"],
                    padding_mask=features["padding_mask"])

    def rtd_labels(self, mask_ids, mask_weights, y_pred):
        """(B, T) int labels: 1 where the discriminator saw a sample different from the original."""
        positions = y_pred["mask_positions"]
        valid = ops.logical_and(ops.cast(mask_weights, "bool"), positions > 0)  # (B, P)
        differs = ops.not_equal(ops.cast(y_pred["sampled_ids"], "int32"),
                                ops.cast(mask_ids, "int32"))
        slot_labels = ops.cast(ops.logical_and(valid, differs), "int32")  # (B, P)
        zeros = ops.zeros_like(ops.cast(y_pred["padding_mask"], "int32"))  # (B, T)
        return replace_at_positions(zeros, positions, slot_labels, valid)

    def label_id_tables(self):
        """Labels checked before training (preprocessor=None: `mask_ids` in the vocabulary)."""
        return [mask_id_table(self)]

    @staticmethod
    def _mlm_targets(y, y_pred, sample_weight):
        if sample_weight is None and not (isinstance(y, dict) and "mask_weights" in y):
            # No weights: every slot at a real position (> 0: position 0 is [CLS], never
            # masked, and pads the slots), so padded slots mark no token as replaced.
            sample_weight = ops.cast(y_pred["mask_positions"] > 0, "float32")
        return mlm_targets(y, sample_weight)

    def metric_weights(self, y, y_pred, sample_weight):
        n = weight_sum(*self._mlm_targets(y, y_pred, sample_weight))
        tokens = ops.sum(ops.cast(y_pred["padding_mask"], "float32"))
        return {"mlm_loss": n, "mlm_accuracy": n, "rtd_loss": tokens, "rtd_accuracy": tokens}

    def losses_and_metrics(self, y, y_pred, sample_weight):
        mask_ids, weights = self._mlm_targets(y, y_pred, sample_weight)
        mlm_loss, mlm_accuracy = weighted_sparse_ce(mask_ids, y_pred["mlm_logits"], weights)

        labels = ops.cast(self.rtd_labels(mask_ids, weights, y_pred), "float32")  # (B, T)
        logits = ops.cast(y_pred["rtd_logits"], "float32")
        tokens = ops.cast(y_pred["padding_mask"], "float32")
        ce = ops.binary_crossentropy(labels, logits, from_logits=True)  # (B, T)
        denom = ops.sum(tokens) + 1e-6
        rtd_loss = ops.sum(ce * tokens) / denom
        correct = ops.cast(ops.equal(ops.cast(logits > 0, "float32"), labels), "float32")
        rtd_accuracy = ops.sum(correct * tokens) / denom
        return mlm_loss + self.rtd_weight * rtd_loss, {
            "mlm_loss": mlm_loss, "mlm_accuracy": mlm_accuracy,
            "rtd_loss": rtd_loss, "rtd_accuracy": rtd_accuracy,
        }
