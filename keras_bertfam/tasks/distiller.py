"""Knowledge distillation of a masked LM (DistilBERT, Sanh et al. 2019)."""
import inspect

import keras
import numpy as np
from keras import ops

from keras_bertfam import preset_hooks
from keras_bertfam.layers.heads import gather_positions
from keras_bertfam.models.backbone import Backbone
from keras_bertfam.models.distil_bert import DistilBertBackbone
from keras_bertfam.tasks.losses import mlm_targets, weight_sum, weighted_sparse_ce
from keras_bertfam.tasks.masked_lm import MaskedLM, mask_id_table
from keras_bertfam.tasks.task import Task

DISTILBERT_LAYERS = (0, 2, 4, 7, 9, 11)


def _check_loss_settings(temperature, **alphas):
    """The softmax temperature: a finite number > 0 (0 or less gave NaN losses); the loss
    weights: finite numbers >= 0, not all 0."""
    def number(value):
        return (isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
                and np.isfinite(value))

    if not number(temperature) or temperature <= 0:
        raise ValueError(f"temperature={temperature!r}: expected a finite number > 0 (the "
                         "softmax temperature of both models' logits; DistilBERT's is 2.0).")
    for name, value in alphas.items():
        if not number(value) or value < 0:
            raise ValueError(f"{name}={value!r}: expected a finite number >= 0 (a loss weight).")
    if not any(alphas.values()):
        raise ValueError(f"{', '.join(f'{k}=0' for k in alphas)}: every loss weighs 0, so "
                         "nothing is trained; give at least one a positive weight.")


# === Student initialization ===
def student_from_teacher(teacher_backbone, layers=DISTILBERT_LAYERS, student_cls=None,
                         **overrides):
    """A `len(layers)`-layer student initialized from a teacher backbone (DistilBERT's recipe).

    The student (`student_cls`, default `DistilBertBackbone`) takes the teacher's sizes; its
    token and position tables and embedding LayerNorm are copied, and its layer i is a copy of
    the teacher's layer `layers[i]` (any list of teacher layers). A student without a segment
    table (DistilBERT) drops the teacher's token types; a student with one copies them. The
    pooler is copied when both have one. Returns the student backbone.

    Example:
    >>> student = student_from_teacher(bert_base, layers=(0, 2, 4, 7, 9, 11))  # doctest: +SKIP
    """
    layers = [int(i) for i in layers]
    if not layers or min(layers) < 0 or max(layers) >= teacher_backbone.num_layers:
        raise ValueError(f"layers must be indices of the teacher's {teacher_backbone.num_layers} "
                         f"layers, got {layers}.")
    student_cls = student_cls or DistilBertBackbone
    params = inspect.signature(student_cls.__init__).parameters
    config = {}
    for name in ("vocabulary_size", "num_heads", "hidden_dim", "intermediate_dim", "dropout",
                 "max_sequence_length", "num_segments", "layer_norm_epsilon",
                 "initializer_range", "embedding_dim", "position_offset"):
        if name in params and hasattr(teacher_backbone, name):
            config[name] = getattr(teacher_backbone, name)
    config["num_layers"] = len(layers)
    config.update(overrides)
    student = student_cls(**config)

    source, target = teacher_backbone.embeddings, student.embeddings
    pairs = [(source.token_embedding, target.token_embedding),
             (source.position_embedding, target.position_embedding),
             (source.layer_norm, target.layer_norm)]
    if source.segment_embedding is not None and target.segment_embedding is not None:
        pairs.append((source.segment_embedding, target.segment_embedding))
    if source.projection is not None and target.projection is not None:
        pairs.append((source.projection, target.projection))
    for i, layer in enumerate(layers):
        pairs.append((teacher_backbone.encoder.layer_block(layer), student.encoder.layer_block(i)))
    teacher_pooler = getattr(teacher_backbone, "pooler_dense", None)
    student_pooler = getattr(student, "pooler_dense", None)
    if teacher_pooler is not None and student_pooler is not None:
        pairs.append((teacher_pooler, student_pooler))
    for src, dst in pairs:
        _copy_weights(src, dst)
    return student


def _copy_weights(source, target):
    if len(source.weights) != len(target.weights):
        raise ValueError(f"Cannot copy {source.name} into {target.name}: different structure.")
    for s, t in zip(source.weights, target.weights):
        if tuple(s.shape) != tuple(t.shape):
            raise ValueError(f"Cannot copy {s.path} {tuple(s.shape)} into {t.path} "
                             f"{tuple(t.shape)}: the student's sizes differ from the teacher's.")
        t.assign(ops.convert_to_numpy(s))  # a copy: JAX would share the buffer


# === Layers ===
class _FrozenTeacher(keras.layers.Layer):
    """Runs the teacher in inference mode (no dropout) and cuts its gradients.

    A functional model passes its `training` flag to every layer whose `call` takes one; this
    layer's `call` does not, so the teacher always runs with `training=False`.
    """

    def __init__(self, teacher, all_tokens, **kwargs):
        super().__init__(**kwargs)
        self.teacher = teacher
        self.all_tokens = all_tokens

    @property
    def metrics(self):
        return []  # the teacher task's own loss trackers are not the distiller's

    def call(self, features, positions):
        sequence = self.teacher.backbone(features, training=False)["sequence_output"]
        logits = self.teacher.mlm_head(sequence, None if self.all_tokens else positions)
        return ops.stop_gradient(sequence), ops.stop_gradient(logits)

    def compute_output_spec(self, features, positions):
        sequence = features["token_ids"]
        batch, length = sequence.shape
        hidden = self.teacher.backbone.hidden_dim
        vocab = self.teacher.mlm_head.vocabulary_size
        slots = length if self.all_tokens else positions.shape[1]
        return (keras.KerasTensor((batch, length, hidden), "float32"),
                keras.KerasTensor((batch, slots, vocab), "float32"))


# === Task ===
@keras.saving.register_keras_serializable(package="keras_bertfam")
class Distiller(Task):
    """Distils a masked-LM teacher into a student (DistilBERT's triple loss, Sanh et al. 2019).

    `loss = alpha_ce · KL(softmax(t/T) ‖ softmax(s/T)) · T² + alpha_mlm · MLM
    + alpha_cos · (1 - cos(h_s, h_t))`: the KL term over the non-pad tokens (averaged per token;
    only the masked slots with `restrict_ce_to_mask=True`), the student's MLM over the masked
    slots, and the cosine-embedding loss between the last hidden states over the non-pad tokens.
    Defaults are DistilBERT's recipe: T = 2, alpha_ce 5, alpha_mlm 2, alpha_cos 1.

    `teacher`: a `MaskedLM` (or a backbone, given a fresh MLM head), frozen inside the model: it
    runs without dropout and gets no gradient. `student`: a `MaskedLM` or a backbone (wrapped in a
    `MaskedLM` whose head starts as a copy of the teacher's when the sizes allow, as DistilBERT's
    did); build one with `student_from_teacher`. Inputs: the union of both backbones' inputs +
    `mask_positions`; labels as `MaskedLM` (`y = mask_ids`, `sample_weight = mask_weights`).

    Outputs: `{"mlm_logits": (B, P, V) student, "student_logits", "teacher_logits": (B, T, V)
    (or (B, P, V) restricted to the mask), "student_hidden", "teacher_hidden": (B, T, H),
    "padding_mask": (B, T)}`.

    Example:
    >>> teacher = kb.tasks.MaskedLM(kb.models.BertBackbone.from_preset(...))   # doctest: +SKIP
    >>> student = student_from_teacher(teacher.backbone)                       # doctest: +SKIP
    >>> Distiller(teacher, student).fit(...)                                    # doctest: +SKIP
    """

    uses_pooled_output = False  # the pooler is not trained by this task

    def __init__(
        self,
        teacher,
        student,
        temperature=2.0,
        alpha_ce=5.0,
        alpha_mlm=2.0,
        alpha_cos=1.0,
        restrict_ce_to_mask=False,
        preprocessor=None,
        **kwargs,
    ):
        for role, model in (("teacher", teacher), ("student", student)):
            if not isinstance(model, (Task, Backbone)):
                raise TypeError(f"Distiller's {role} is a MaskedLM or a kb.models backbone; got "
                                f"{type(model).__name__} {model!r:.80}.")
            if isinstance(model, Task) and not isinstance(model, MaskedLM):
                # (a TextClassifier's logits, or with an `activation` its probabilities, are
                # not what this distils)
                raise TypeError(
                    f"Distiller distils masked-LM logits: its {role} is a MaskedLM or a "
                    f"backbone; got a {type(model).__name__}. Pass its backbone "
                    f"({role}.backbone) to distil the encoder.")
        if not isinstance(teacher, MaskedLM):
            teacher = MaskedLM(teacher, name="teacher")
        if not isinstance(student, MaskedLM):
            student = MaskedLM(student, name="student")
            _copy_head_if_same_size(teacher.mlm_head, student.mlm_head)
        sizes = [m.backbone.vocabulary_size for m in (teacher, student)]
        if sizes[0] != sizes[1]:
            raise ValueError(
                f"The distillation loss compares the teacher's and the student's logits over "
                f"one vocabulary: the teacher's vocabulary_size ({sizes[0]}) and the student's "
                f"({sizes[1]}) must be equal (the same tokenizer).")
        _check_loss_settings(temperature=temperature, alpha_ce=alpha_ce, alpha_mlm=alpha_mlm,
                             alpha_cos=alpha_cos)
        if teacher.backbone.hidden_dim != student.backbone.hidden_dim:
            raise ValueError(
                f"The cosine loss compares hidden states: the teacher's width "
                f"({teacher.backbone.hidden_dim}) and the student's "
                f"({student.backbone.hidden_dim}) must be equal."
            )
        teacher.trainable = False
        self.teacher = teacher
        self.student = student
        self.temperature = temperature
        self.alpha_ce = alpha_ce
        self.alpha_mlm = alpha_mlm
        self.alpha_cos = alpha_cos
        self.restrict_ce_to_mask = restrict_ce_to_mask
        self.preprocessor = preprocessor
        self.frozen_teacher = _FrozenTeacher(teacher, not restrict_ce_to_mask, name="teacher_call")

        # === Functional model ===
        names = list(dict.fromkeys(list(teacher.backbone.input) + list(student.backbone.input)))
        inputs = {n: keras.Input(shape=(None,), dtype="int32", name=n)
                  for n in names + ["mask_positions"]}
        positions = inputs["mask_positions"]
        teacher_hidden, teacher_logits = self.frozen_teacher(
            {n: inputs[n] for n in teacher.backbone.input}, positions)
        student_hidden = student.backbone(
            {n: inputs[n] for n in student.backbone.input})["sequence_output"]
        if restrict_ce_to_mask:
            student_logits = student.mlm_head(student_hidden, positions)  # (B, P, V)
            mlm_logits = student_logits
        else:
            student_logits = student.mlm_head(student_hidden)  # (B, T, V)
            mlm_logits = gather_positions(student_logits, positions)  # (B, P, V)
        outputs = {
            "mlm_logits": mlm_logits,
            "student_logits": student_logits,
            "teacher_logits": teacher_logits,
            "student_hidden": student_hidden,
            "teacher_hidden": teacher_hidden,
            "padding_mask": inputs["padding_mask"],
        }
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self._track_losses(["ce_loss", "mlm_loss", "cos_loss", "mlm_accuracy"])

    @property
    def backbone(self):
        """The student's backbone: the model distillation produces."""
        return self.student.backbone

    # === Config ===
    # Keras saves the files of an object held twice once (under its first place), so a
    # preprocessor or tokenizer the distiller shares with its teacher or student
    # (`preprocessor=teacher.preprocessor`) came back as two objects, the second without its
    # vocabulary. Each repeat is written as {"shared_with": its first place}, and shared again
    # on load.
    _SHARED_PLACES = ("preprocessor", "teacher.preprocessor", "student.preprocessor")

    def get_config(self):
        config = super().get_config()
        first = {}
        for place in self._SHARED_PLACES:
            owner, holder = self, config
            if place != "preprocessor":
                model = place.split(".")[0]
                owner, holder = getattr(self, model), config[model]["config"]
            preprocessor = owner.preprocessor
            if preprocessor is None:
                continue
            if id(preprocessor) in first:
                holder["preprocessor"] = {"shared_with": first[id(preprocessor)]}
                continue
            first[id(preprocessor)] = place
            tokenizer = getattr(preprocessor, "tokenizer", None)
            if tokenizer is None:
                continue
            if id(tokenizer) in first:
                holder["preprocessor"]["config"]["tokenizer"] = {
                    "shared_with": first[id(tokenizer)]}
            else:
                first[id(tokenizer)] = place + ".tokenizer"
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        objects = {}
        for place in cls._SHARED_PLACES:
            model = None if place == "preprocessor" else place.split(".")[0]
            if model is not None and not (isinstance(config[model], dict)
                                          and "config" in config[model]):
                continue  # given as an object
            holder = config if model is None else dict(config[model]["config"])
            value = holder.get("preprocessor")
            if isinstance(value, dict) and "shared_with" in value:
                value = objects[value["shared_with"]]
            elif isinstance(value, dict) and "class_name" in value:
                value = _deserialize_sharing(value, objects)
            if value is not None:
                objects[place] = value
                objects[place + ".tokenizer"] = getattr(value, "tokenizer", None)
            holder["preprocessor"] = value  # Task.from_config passes an object on as it is
            if model is not None:
                config[model] = keras.saving.deserialize_keras_object(
                    dict(config[model], config=holder))
        return super().from_config(config)

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, **kwargs):
        from keras_bertfam.preprocessing import MaskedLMPreprocessor

        return MaskedLMPreprocessor(tokenizer, sequence_length, **kwargs)

    def label_id_tables(self):
        """Labels checked before training (preprocessor=None: `mask_ids` in the vocabulary)."""
        return [mask_id_table(self)]

    def metric_weights(self, y, y_pred, sample_weight):
        mask_ids, weights = mlm_targets(y, sample_weight)
        n = weight_sum(mask_ids, weights)
        tokens = ops.sum(ops.cast(y_pred["padding_mask"], "float32"))
        return {"ce_loss": n if self.restrict_ce_to_mask else tokens, "mlm_loss": n,
                "cos_loss": tokens, "mlm_accuracy": n}

    def losses_and_metrics(self, y, y_pred, sample_weight):
        mask_ids, weights = mlm_targets(y, sample_weight)
        weights = ops.cast(weights, "float32")
        tokens = ops.cast(y_pred["padding_mask"], "float32")  # (B, T)
        t = self.temperature

        # KL(teacher || student) at temperature T, per token, times T^2 (Hinton et al. 2015).
        s_log = ops.log_softmax(ops.cast(y_pred["student_logits"], "float32") / t, axis=-1)
        t_log = ops.log_softmax(ops.cast(y_pred["teacher_logits"], "float32") / t, axis=-1)
        kl = ops.sum(ops.exp(t_log) * (t_log - s_log), axis=-1)  # (B, T) or (B, P)
        kl_weights = weights if self.restrict_ce_to_mask else tokens
        ce_loss = ops.sum(kl * kl_weights) / (ops.sum(kl_weights) + 1e-6) * t**2

        mlm_loss, mlm_accuracy = weighted_sparse_ce(mask_ids, y_pred["mlm_logits"], weights)

        s_h = ops.cast(y_pred["student_hidden"], "float32")
        t_h = ops.cast(y_pred["teacher_hidden"], "float32")
        cos = ops.sum(s_h * t_h, axis=-1) / ops.maximum(
            ops.norm(s_h, axis=-1) * ops.norm(t_h, axis=-1), 1e-8)  # (B, T)
        cos_loss = ops.sum((1.0 - cos) * tokens) / (ops.sum(tokens) + 1e-6)

        loss = self.alpha_ce * ce_loss + self.alpha_mlm * mlm_loss + self.alpha_cos * cos_loss
        return loss, {"ce_loss": ce_loss, "mlm_loss": mlm_loss, "cos_loss": cos_loss,
                      "mlm_accuracy": mlm_accuracy}

    def save_to_preset(self, preset_dir):
        """Saves the student backbone (and the preprocessor's tokenizer) as a backbone preset."""
        tokenizer = getattr(self.preprocessor, "tokenizer", None)
        preset_hooks.call("save_backbone", self.student.backbone, preset_dir, tokenizer=tokenizer)


def _deserialize_sharing(preprocessor, objects):
    """A preprocessor's config -> the preprocessor, its tokenizer the object `objects` holds at
    the place its {"shared_with": place} names (if it names one)."""
    tokenizer = preprocessor.get("config", {}).get("tokenizer")
    if not (isinstance(tokenizer, dict) and "shared_with" in tokenizer):
        return keras.saving.deserialize_keras_object(preprocessor)
    name = "keras_bertfam>shared:" + tokenizer["shared_with"]  # resolved by the scope below
    preprocessor = dict(preprocessor, config=dict(preprocessor["config"], tokenizer=name))
    with keras.saving.custom_object_scope({name: objects[tokenizer["shared_with"]]}):
        return keras.saving.deserialize_keras_object(preprocessor)


def _copy_head_if_same_size(source, target):
    """The MLM transform, LayerNorm and output bias (not the tied table) when shapes agree."""
    pairs = [(s, t) for layer in ("dense", "layer_norm")
             for s, t in zip(getattr(source, layer).weights, getattr(target, layer).weights)]
    pairs.append((source.bias, target.bias))
    if all(tuple(s.shape) == tuple(t.shape) for s, t in pairs):
        for s, t in pairs:
            t.assign(ops.convert_to_numpy(s))  # a copy: JAX would share the buffer
