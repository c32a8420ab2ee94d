"""Fine-tuning: SQuAD-style extractive question answering (start / end logits over tokens)."""
import math

import keras
import numpy as np
from keras import ops

from keras_bertfam.models.backbone import head_initializer
from keras_bertfam.preprocessing.finetuning import ANSWER_START, NOT_AN_INTEGER
from keras_bertfam.tasks.classifier import _mean, label_weights
from keras_bertfam.tasks.masked_lm import backbone_inputs
from keras_bertfam.tasks.task import Task


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SpanLogits(keras.layers.Layer):
    """(B, T, H) -> start and end logits (B, T); padding gets a large negative logit."""

    def __init__(self, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dense = keras.layers.Dense(2, kernel_initializer=self.kernel_initializer,
                                        name="span")

    def build(self, sequence_shape, padding_mask_shape=None):
        self.dense.build(sequence_shape)
        self.built = True

    def call(self, sequence, padding_mask):
        logits = ops.cast(self.dense(sequence), "float32")  # (B, T, 2)
        penalty = (1.0 - ops.cast(padding_mask, "float32")) * -1e9  # (B, T)
        return {"start_logits": logits[..., 0] + penalty, "end_logits": logits[..., 1] + penalty}

    def compute_output_shape(self, sequence_shape, padding_mask_shape=None):
        shape = tuple(sequence_shape[:2])
        return {"start_logits": shape, "end_logits": shape}

    def get_config(self):
        return dict(super().get_config(),
                    kernel_initializer=keras.initializers.serialize(self.kernel_initializer))


@keras.saving.register_keras_serializable(package="keras_bertfam")
class QuestionAnswerer(Task):
    """Span extraction (BERT on SQuAD): `Dense(2)` over the final hidden states gives start and end
    logits; the loss is the mean of the start and end cross-entropies.

    The preprocessor (`QuestionAnswererPreprocessor`) cuts long contexts into windows with a
    stride; windows that do not hold the answer point at `[CLS]`. On an `XLNetBackbone` the
    windows are XLNet's (HF's `run_qa.py` for XLNet, the layout HF's
    `XLNetForQuestionAnsweringSimple` is fine-tuned on): `context <sep> question <sep> <cls>`,
    padded on the left, the no-answer label at `<cls>`, the last position. Raw input:
    `x = (questions, contexts)`, `y = (answer_starts, answer_texts)` (character offsets, SQuAD's
    format); a `sample_weight` per example weights each of its windows (the loss and accuracies
    are weighted means over windows), and `fit`'s `batch_size` counts windows (HF's batch of
    features; 32 by default). `answer(questions, contexts)` returns the best span of each
    example, over all its windows, as text with its character offsets, and the example's null
    score (HF's SQuAD v2 post-processing: the minimum over its windows of the classification
    token's start + end logits); `handle_impossible_answer=True` (HF's pipeline option) answers
    "" (start = end = -1) where that null score beats the best span's score by more than
    `null_score_diff_threshold`.
    Any family whose tokenizer gives character offsets (`tokenize_with_offsets`): every family's
    (WordPiece: BERT and its kin; byte-level BPE: RoBERTa, Longformer; SentencePiece: ALBERT,
    XLNet). Answers are spans of context tokens only (never the question, a special token or
    padding).

    Export (`kb.export.export_saved_model`): `question`, `context` strings -> `answer_text`,
    `answer_start`, `answer_end` (offsets in Unicode characters into the original context, as
    `answer()` and HF's offsets: lowercasing and accent stripping do not shift them; bytes that
    are not UTF-8 are one U+FFFD a sequence, in both), plus the
    token span, its score (`span_score`) and the logits of the window it was found in, and
    `null_score`. The string signature cuts long contexts into the preprocessor's strided
    windows and keeps each example's best span over its windows, so it gives `answer()`'s
    answers; exported with `handle_impossible_answer=True` (and `null_score_diff_threshold`) its
    `answer_*` are the empty answer (-1, -1, "") where `answer()`'s with the same options are,
    the `span_*` outputs still the best span (`answer()`'s score is then `null_score`). The
    `token_ids` signature scores the packed windows it is given, one per row: the logits, the
    best span and the window's `null_score` (the logits at its first classification token,
    `[CLS]` first, XLNet's `<cls>` last; NaN for a row without one), whose minimum over an
    example's windows is the string signature's `null_score`.

    Example:
    >>> qa = kb.tasks.QuestionAnswerer.from_preset("bert_tiny_en_uncased")  # doctest: +SKIP
    >>> qa.answer(["Who?"], ["Ada wrote it."])  # doctest: +SKIP
    """

    uses_pooled_output = False  # the pooler is not trained by this task
    follows_xlnet_layout = True  # HF's XLNetForQuestionAnsweringSimple reads XLNet's layout

    preprocessor_args = ("sequence_length", "stride", "max_question_length")
    default_learning_rate = 5e-5
    global_attention_task = "QuestionAnswerer"

    def __init__(self, backbone, preprocessor=None, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.span_head = SpanLogits(kernel_initializer=head_initializer(backbone), name="span_head")
        inputs, features = backbone_inputs(backbone, task=self.global_attention_task)
        sequence = backbone(features)["sequence_output"]
        outputs = self.span_head(sequence, inputs["padding_mask"])
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self._track_losses(["start_accuracy", "end_accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=384, stride=128,
                             max_question_length=64, **kwargs):
        from keras_bertfam.preprocessing.finetuning import QuestionAnswererPreprocessor

        return QuestionAnswererPreprocessor(tokenizer, sequence_length, stride=stride,
                                            max_question_length=max_question_length)

    serving_inputs = ("question", "context")

    def serving_features(self, features, special_token_ids):
        """Answers lie in the context's tokens. From strings, those are the tokens with a
        character span in the context (as `answer()`); from packed ids, the tokens after the first
        separator that are neither separators nor padding (`[CLS] q [SEP] c [SEP]`, RoBERTa's
        `<s> q </s></s> c </s>`: RoBERTa's inputs have no segment ids), or in XLNet's layout
        (`pad... c <sep> q <sep> <cls>`) the real tokens before the first separator.

        The classification token whose logits are a window's null score (`is_cls`): from strings,
        the preprocessor's (`meta["cls_index"]`); from packed ids, the first real token holding
        the classification token's id (HF `run_qa.py`'s `input_ids.index(cls_token_id)`):
        `[CLS]` first, XLNet's `<cls>` last, the same positions for the preprocessor's windows."""
        if "context_char_start" in features:
            return dict(features, in_context=ops.greater_equal(features["context_char_start"], 0))
        real = ops.equal(features["padding_mask"], 1)
        is_sep = ops.equal(features["token_ids"], special_token_ids["sep"])
        after_sep = ops.cumsum(ops.cast(is_sep, "int32"), axis=1) > 0
        side = after_sep if self.packing_layout != "xlnet" else ops.logical_not(after_sep)
        in_context = ops.logical_and(ops.logical_and(side, ops.logical_not(is_sep)), real)
        is_cls = ops.logical_and(ops.equal(features["token_ids"], special_token_ids["cls"]), real)
        first_cls = ops.logical_and(is_cls, ops.equal(ops.cumsum(ops.cast(is_cls, "int32"),
                                                                 axis=1), 1))
        return dict(features, in_context=in_context, is_cls=first_cls)

    def serving_outputs(self, features, outputs, max_answer_length=30):
        """Start / end logits and the best span of the context (token indices, inclusive), scored
        as `answer()` scores one window. From strings (`serving_default`) also the answer in the
        context: `answer_start` / `answer_end`, Unicode-character offsets into the original
        context string (`context[answer_start:answer_end]` in Python; -1 when the context is
        empty; `serving_strings` adds the example's `answer_text`). Each window's `null_score`: the start + end logits at its
        classification token (`is_cls`; NaN for a packed row without one), of which
        `serving_strings` keeps each example's minimum (the `token_ids` signature gives it per
        row)."""
        start, end = outputs["start_logits"], outputs["end_logits"]  # (B, T)
        penalty = ops.where(features["in_context"], 0.0, -1e9)
        scores = ops.expand_dims(start + penalty, 2) + ops.expand_dims(end + penalty, 1)  # (B, T, T)
        t = ops.arange(ops.shape(start)[1])
        length = ops.expand_dims(t, 0) - ops.expand_dims(t, 1)  # end - start
        allowed = ops.logical_and(length >= 0, length < max_answer_length)
        scores = ops.where(ops.expand_dims(allowed, 0), scores, -2e9)
        flat = ops.reshape(scores, (ops.shape(scores)[0], -1))
        best = ops.cast(ops.argmax(flat, axis=-1), "int32")
        size = ops.cast(ops.shape(start)[1], "int32")
        span_start, span_end = best // size, best % size
        out = {"start_logits": start, "end_logits": end, "span_start": span_start,
               "span_end": span_end, "span_score": ops.max(flat, axis=-1)}
        if "is_cls" in features:  # each window's null score (NaN without a classification token)
            has_cls = ops.any(ops.cast(features["is_cls"], "bool"), axis=-1)
            out["null_score"] = ops.where(has_cls, null_scores(start, end, features["is_cls"]),
                                          float("nan"))
        if "context_char_start" in features:
            out.update(answer_in_context(features, span_start, span_end, out["span_score"]))
        return out

    def serving_options(self, handle_impossible_answer=False, null_score_diff_threshold=0.0):
        """The string signature's options (`export_saved_model`'s), checked as `answer()`'s."""
        handle, threshold = check_no_answer_options(handle_impossible_answer,
                                                    null_score_diff_threshold)
        return {"handle_impossible_answer": handle, "null_score_diff_threshold": threshold}

    def serving_strings(self, texts, tokenizer, sequence_length, outputs_of,
                        handle_impossible_answer=False, null_score_diff_threshold=0.0):
        """The string signature: every window of every example through `outputs_of`, then each
        example's best-scoring window (the first of equals, as `answer()`), its null score (the
        minimum over its windows) and, with `handle_impossible_answer`, `answer()`'s decision."""
        import tensorflow as tf

        from keras_bertfam.preprocessing.finetuning import QuestionAnswererPreprocessor
        from keras_bertfam.preprocessing.tokenizers import valid_utf8

        windowing = {k: getattr(self.preprocessor, k) for k in ("stride", "max_question_length")
                     if self.preprocessor is not None}
        preprocessor = QuestionAnswererPreprocessor(tokenizer, sequence_length,
                                                    layout=self.packing_layout, **windowing)
        question, context = texts
        context = valid_utf8(context)  # the text the offsets index, as `answer()`'s
        features, meta = preprocessor.windows(question, context)
        window_example = meta["example_index"]
        # the classification token as a packed feature: dynamic padding trims it with the rows
        is_cls = cls_mask(meta["cls_index"], sequence_length)
        # (no copy of the context per window: a long context has thousands of windows, and
        # their copies took memory quadratic in its length; the answer text is cut once below)
        out = outputs_of(dict(features, context_char_start=meta["token_start"],
                              context_char_end=meta["token_end"],
                              is_cls=tf.cast(is_cls, tf.int32)))
        score, count = out["span_score"], tf.size(question)
        best = tf.math.unsorted_segment_max(score, window_example, count)
        window = tf.range(tf.size(window_example))
        first_best = tf.math.unsorted_segment_min(
            tf.where(score >= tf.gather(best, window_example), window, tf.size(window)),
            window_example, count)
        result = {k: tf.gather(v, first_best) for k, v in out.items()}
        result["answer_text"] = answer_text(context, result["answer_start"],
                                            result["answer_end"])
        result["null_score"] = tf.math.unsorted_segment_min(out["null_score"], window_example,
                                                            count)
        if handle_impossible_answer:
            found = result["answer_start"] >= 0  # answer() scores a missing span -inf
            span_score = tf.where(found, result["span_score"], float("-inf"))
            empty = says_no_answer(result["null_score"], span_score,
                                   tf.constant(null_score_diff_threshold, tf.float32))
            for key, none in (("answer_start", -1), ("answer_end", -1), ("answer_text", "")):
                result[key] = tf.where(empty, tf.constant(none, result[key].dtype), result[key])
        return result

    def metric_weights(self, y, y_pred, sample_weight):
        return label_weights(self, ops.reshape(y["start_positions"], (-1,)),
                             window_weights(sample_weight))

    def losses_and_metrics(self, y, y_pred, sample_weight):
        """Means over the windows, weighted by `sample_weight` (each window takes its
        example's weight: `QuestionAnswererPreprocessor`)."""
        losses, metrics = [], {}
        w = window_weights(sample_weight)
        for key, name in (("start_positions", "start"), ("end_positions", "end")):
            labels = ops.cast(ops.reshape(y[key], (-1,)), "int32")
            logits = y_pred[f"{name}_logits"]
            losses.append(_mean(ops.sparse_categorical_crossentropy(labels, logits,
                                                                    from_logits=True), w))
            metrics[f"{name}_accuracy"] = _mean(
                ops.cast(ops.equal(ops.argmax(logits, axis=-1), labels), "float32"), w)
        return (losses[0] + losses[1]) / 2.0, metrics

    def _raw_examples(self, x, y, sample_weight):
        if y is not None:
            check_answer_pair(y)
            check_answers(x[1], *y)
        if y is None:
            return (tuple(x),)
        return (tuple(x), tuple(y)) if sample_weight is None else \
            (tuple(x), tuple(y), sample_weight)

    def answer(self, questions, contexts, max_answer_length=30, batch_size=32,
               handle_impossible_answer=False, null_score_diff_threshold=0.0):
        """Best answer span per example: `[{"text", "start", "end", "score", "null_score"}]`
        (character offsets into the context, `context[start:end] == text`; `score` the span's
        start + end logit; "" with start = end = -1 when the context has no token). A context
        given as bytes is read as UTF-8, an invalid sequence as U+FFFD (as the tokenizer and
        the exported signature read it): offsets are characters of that text, `text` its UTF-8
        bytes (`context.decode("utf-8", "replace")[start:end].encode()`).

        `null_score` is HF's SQuAD v2 null score (`postprocess_qa_predictions` in its
        `utils_qa.py`): the minimum over the example's windows of the classification token's
        start + end logits (`[CLS]`; XLNet's `<cls>`, last). With `handle_impossible_answer=True`
        (the option of HF's `QuestionAnsweringPipeline`), an example whose null score exceeds
        its best span's score by more than `null_score_diff_threshold` (utils_qa's name) gets
        the empty answer `{"text": "", "start": -1, "end": -1, "score": null_score}`."""
        import tensorflow as tf

        handle, threshold = check_no_answer_options(handle_impossible_answer,
                                                    null_score_diff_threshold)

        for name, texts in (("questions", questions), ("contexts", contexts)):
            if isinstance(texts, (str, bytes)):
                raise ValueError(f"answer takes lists of questions and contexts; got a single "
                                 f"string as {name}: {texts[:40]!r}. Pass [{texts[:20]!r}].")
        if len(questions) != len(contexts):
            raise ValueError(f"answer got {len(questions)} questions and {len(contexts)} "
                             "contexts: one context per question.")
        for name, texts in (("questions", questions), ("contexts", contexts)):
            bad = next((i for i, t in enumerate(texts) if not isinstance(t, (str, bytes))), None)
            if bad is not None:
                raise ValueError(f"answer takes strings; {name}[{bad}] is "
                                 f"{type(texts[bad]).__name__} {texts[bad]!r}.")
        if isinstance(max_answer_length, (bool, np.bool_)) or not isinstance(
                max_answer_length, (int, np.integer)) or max_answer_length < 1:
            raise ValueError(f"max_answer_length must be a positive number of tokens; got "
                             f"{max_answer_length!r}.")
        if len(questions) == 0:
            return []
        from keras_bertfam.preprocessing.tokenizers import valid_utf8

        # Offsets index the context's characters; bytes are read as UTF-8, an invalid sequence
        # as U+FFFD (as the tokenizer reads them, and the exported signature): their answers are
        # that text's, as UTF-8 bytes.
        cleaned = valid_utf8(tf.constant(contexts)).numpy()
        texts = [c if isinstance(c, str) else t.decode("utf-8")
                 for c, t in zip(contexts, cleaned)]
        features, meta = self.preprocessor.windows(tf.constant(questions), cleaned)
        features = self._checked_features(features)
        out = super(Task, self).predict(features, batch_size=batch_size, verbose=0)
        starts, ends = out["start_logits"], out["end_logits"]
        example = meta["example_index"].numpy()
        t0, t1 = meta["token_start"].numpy(), meta["token_end"].numpy()
        window_null = ops.convert_to_numpy(null_scores(
            starts, ends, cls_mask(meta["cls_index"].numpy(), starts.shape[1])))
        null = np.full(len(questions), np.inf, np.float32)
        np.minimum.at(null, example, window_null)
        best = [None] * len(questions)
        for w in range(len(example)):
            valid = t0[w] >= 0
            s = np.where(valid, starts[w], -np.inf)
            e = np.where(valid, ends[w], -np.inf)
            scores = s[:, None] + e[None, :]  # (T, T): start i, end j
            length = np.arange(len(e))[None, :] - np.arange(len(s))[:, None]
            scores = np.where((length >= 0) & (length < max_answer_length), scores, -np.inf)
            i, j = np.unravel_index(np.argmax(scores), scores.shape)
            score = scores[i, j]  # float32, as the export's
            b = int(example[w])
            if np.isfinite(score) and (best[b] is None or score > best[b]["score"]):
                start, end = int(t0[w, i]), int(t1[w, j])
                text = texts[b][start:end]
                best[b] = {"text": text if isinstance(contexts[b], str) else text.encode(),
                           "start": start, "end": end, "score": score}
        answers = []
        for b, found in enumerate(best):
            none = {"text": "" if isinstance(contexts[b], str) else b"", "start": -1, "end": -1,
                    "score": np.float32(-np.inf)}
            found = found or none
            if handle and says_no_answer(null[b], found["score"], np.float32(threshold)):
                found = dict(none, score=null[b])
            answers.append(dict(found, score=float(found["score"]), null_score=float(null[b])))
        return answers


def window_weights(sample_weight):
    """A batch's sample weights as (W,) float32, or None. Keras gives in-memory weights once per
    label (a dict like the labels', the same weights twice): the start positions' are taken."""
    if isinstance(sample_weight, dict):
        sample_weight = sample_weight["start_positions"]
    return None if sample_weight is None else ops.cast(ops.reshape(sample_weight, (-1,)),
                                                       "float32")


def check_no_answer_options(handle_impossible_answer, null_score_diff_threshold):
    """`answer()`'s and the export's "no answer" options -> (bool, float), or a ValueError
    naming the value."""
    if not isinstance(handle_impossible_answer, (bool, np.bool_)):
        raise ValueError(f"handle_impossible_answer must be True or False; got "
                         f"{handle_impossible_answer!r}.")
    threshold = null_score_diff_threshold
    if isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, (int, float,
                                                                             np.number)) \
            or not math.isfinite(threshold):
        raise ValueError(f"null_score_diff_threshold must be a finite number (HF's default 0.0); "
                         f"got {null_score_diff_threshold!r}.")
    return bool(handle_impossible_answer), float(threshold)


def cls_mask(cls_index, length):
    """`(W,)` classification-token positions (the preprocessor's `meta["cls_index"]`) ->
    `(W, length)` bool, True there."""
    return ops.equal(ops.expand_dims(ops.arange(length), 0),
                     ops.expand_dims(ops.cast(cls_index, "int32"), 1))


def null_scores(start_logits, end_logits, is_cls):
    """Each window's null score, HF's SQuAD v2 (`utils_qa.py`): the start + end logits of its
    classification token (`is_cls`, (W, T), nonzero there). float32, in `answer()` (NumPy) and
    in the export's graph alike."""
    both = ops.cast(start_logits, "float32") + ops.cast(end_logits, "float32")
    return ops.sum(ops.where(ops.cast(is_cls, "bool"), both, 0.0), axis=-1)


def says_no_answer(null_score, span_score, null_score_diff_threshold):
    """HF's SQuAD v2 decision: no answer when the example's null score exceeds its best span's
    score by more than the threshold (float32 NumPy scalars in `answer()`, tensors in the
    export)."""
    return null_score > span_score + null_score_diff_threshold


def check_answer_pair(y):
    """`y` of a QuestionAnswerer's in-memory fit / evaluate is SQuAD's pair (answer_starts,
    answer_texts), one entry per example each (a list of class ids gave "'int' object is not
    iterable")."""
    if not (isinstance(y, (tuple, list)) and len(y) == 2 and all(
            isinstance(part, (list, tuple, np.ndarray)) for part in y)):
        raise ValueError(
            "QuestionAnswerer takes labels y = (answer_starts, answer_texts): two lists, the "
            "answers' character offsets into their contexts (-1: no answer) and their texts; "
            f"got {type(y).__name__} {y!r:.60}.")


def check_answers(contexts, answer_starts, answer_texts):
    """Answers given as lists (SQuAD's character offset and text) -> ValueError naming the first
    example whose text is not at its offset (the tf.data preprocessor checks datasets)."""
    for i, (context, start, text) in enumerate(zip(contexts, answer_starts, answer_texts)):
        if isinstance(start, (bool, np.bool_)) or not isinstance(start, (int, float, np.number)) \
                or not float(start).is_integer():
            raise ValueError(NOT_AN_INTEGER.format(what="answer_start", expected=ANSWER_START)
                             .format(f"{start!r} (example {i})"))
        if not (isinstance(context, str) and isinstance(text, str)) or int(start) < 0:
            continue
        found = context[int(start):int(start) + len(text)]
        if found != text:
            raise ValueError(
                f"Example {i}: the answer {text!r} is not in its context at answer_start="
                f"{int(start)} (the context has {found!r} there; offsets are in characters)."
            )


def answer_in_context(features, span_start, span_end, span_score):
    """Token span -> character offsets into the original context (serving only: TensorFlow
    ops; `serving_strings` cuts the answer text once per example, `answer_text`). The offsets
    come from `tokenize_with_offsets`, packed like the tokens (-1 off the context)."""
    import tensorflow as tf

    found = span_score > -1e8  # some context token was allowed
    char_start = tf.gather(features["context_char_start"], span_start, batch_dims=1)
    char_end = tf.gather(features["context_char_end"], span_end, batch_dims=1)
    char_start = tf.where(found, char_start, -1)
    char_end = tf.where(found, char_end, -1)
    return {"answer_start": char_start, "answer_end": char_end}


def answer_text(context, char_start, char_end):
    """`context[char_start:char_end]` in Unicode characters ("" where -1)."""
    import tensorflow as tf

    return tf.strings.substr(context, tf.maximum(char_start, 0),
                             tf.maximum(char_end - char_start, 0), unit="UTF8_CHAR")
