"""Which tokens a task gives global attention (Longformer), read from the packed layout alone.

One rule for the model's graph and for `tf.data`: it is written over an ops namespace, so the
Longformer backbone runs it in `keras.ops` and the preprocessors and tasks in TensorFlow
(`TF_OPS`). It lives in preprocessing, the layer every user of it may import.
"""
import types

import tensorflow as tf
from keras import ops

# keras.ops' names for the TensorFlow ops the rule is written in.
TF_OPS = types.SimpleNamespace(cast=tf.cast, equal=tf.equal, greater=tf.greater,
                               cumsum=tf.cumsum, pad=tf.pad, sum=tf.reduce_sum,
                               ones_like=tf.ones_like, zeros_like=tf.zeros_like)


def global_attention_for_task(features, task, xp=ops):
    """The global attention a task puts on its inputs (the paper's choices, HF's defaults).

    - "TextClassifier": the first token (`<s>`).
    - "QuestionAnswerer": the question, `<s>` included: HF's "tokens before the first `</s>`",
      the separator being the token that closes the first segment (one `[SEP]` or RoBERTa's
      `</s></s>`).
    - "MultipleChoice": the choice, HF `LongformerForMultipleChoice`'s "tokens after the first
      `</s>` and the one after it": of `<s> context </s></s> choice </s>`, `choice </s>`.
    - anything else (MaskedLM, TokenClassifier): none.

    `xp`: the ops it is written in, `keras.ops` in the model's graph (a Longformer backbone's
    `task_global_attention`); `TF_OPS` in `tf.data`, on every backend: a preset's preprocessor
    gives the mask with it (`ReturnsModelInputs.model_inputs`) and the tasks count a row's global
    tokens with it (`kb.tasks.task.check_global_attention`).
    """
    padding = xp.cast(xp.cast(features["padding_mask"], "bool"), "int32")
    position = xp.cumsum(xp.ones_like(padding), axis=1) - 1
    if task == "TextClassifier":
        return padding * xp.cast(xp.equal(position, 0), "int32")
    if task in ("QuestionAnswerer", "MultipleChoice"):
        token_ids = xp.cast(features["token_ids"], "int32")
        first_segment = xp.cast(xp.equal(features["segment_ids"], 0), "int32") * padding
        # The last token of the first segment (its next position is not in it): a separator.
        # With one segment id throughout (HF's RoBERTa inputs), the row's closing separator.
        nxt = xp.pad(first_segment[:, 1:], [[0, 0], [0, 1]])
        sep = xp.sum(token_ids * first_segment * (1 - nxt), axis=1, keepdims=True)  # (B, 1)
        before = xp.cast(xp.equal(xp.cumsum(xp.cast(xp.equal(token_ids, sep), "int32"),
                                            axis=1), 0), "int32")  # before the first sep
        if task == "QuestionAnswerer":
            return padding * before
        first_sep = xp.sum(before, axis=1, keepdims=True)  # (B, 1): its position
        return padding * xp.cast(xp.greater(position, first_sep + 1), "int32")
    return xp.zeros_like(padding)
