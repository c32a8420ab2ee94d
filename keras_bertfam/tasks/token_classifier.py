"""Fine-tuning: per-token classification (CoNLL-style tagging), labels on each word's first piece."""
import keras
from keras import ops

from keras_bertfam.models.backbone import head_initializer
from keras_bertfam.tasks.classifier import (
    _mean,
    check_label_values,
    class_outputs,
    label_weights,
    share_num_classes,
)
from keras_bertfam.preprocessing.finetuning import ONE_LABEL_PER_WORD
from keras_bertfam.tasks.masked_lm import backbone_inputs
from keras_bertfam.tasks.task import Task


@keras.saving.register_keras_serializable(package="keras_bertfam")
class TokenClassifier(Task):
    """`dropout -> Dense(num_classes)` on every token's final hidden state (BERT's NER setup).

    Labels belong to words: the preprocessor (`TokenClassifierPreprocessor`) gives each word's
    label to its first WordPiece and weight 0 to the other pieces, special tokens and padding;
    the loss is the cross-entropy averaged over weighted tokens. On XLNet the pieces come first,
    then `<sep> <cls>`, padded on the left (HF `XLNetForTokenClassification`'s rows).

    Raw input: `x` a list of whitespace-separated sentences (or of word lists), `y` one label per
    word (lists of lists, or a [B, W] array padded with -1). `predict` returns logits
    (B, T, num_classes); `predict_words` returns one label per word. Without a preprocessor, `y`
    is (B, T) token labels, a label < 0 ignored (HF's -100: weight 0 in the loss and accuracy).
    `fit(class_weight={class id: weight})` weighs each token by its label's class.

    Example:
    >>> tagger = kb.tasks.TokenClassifier.from_preset("bert_tiny_en_uncased", num_classes=9)  # doctest: +SKIP
    >>> tagger.fit(["John lives in Paris"], [[1, 0, 0, 5]])  # doctest: +SKIP
    """

    uses_pooled_output = False  # the pooler is not trained by this task

    preprocessor_args = ("sequence_length",)
    preprocessor_shared_args = ("num_classes",)
    default_learning_rate = 5e-5
    global_attention_task = "TokenClassifier"
    labels_are_one_array = True
    follows_xlnet_layout = True

    def __init__(self, backbone, num_classes, preprocessor=None, dropout=0.1, **kwargs):
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}.")
        self.backbone = backbone
        self.num_classes = num_classes
        self.preprocessor = share_num_classes(preprocessor, num_classes)
        self.dropout = dropout
        self.dropout_layer = keras.layers.Dropout(dropout, name="head_dropout")
        self.head = keras.layers.Dense(num_classes, kernel_initializer=head_initializer(backbone),
                                       name="logits")
        inputs, features = backbone_inputs(backbone, task=self.global_attention_task)
        sequence = backbone(features)["sequence_output"]
        logits = self.head(self.dropout_layer(sequence))  # (B, T, C)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._track_losses(["accuracy"])

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, num_classes=None,
                             **kwargs):
        from keras_bertfam.preprocessing.finetuning import TokenClassifierPreprocessor

        return TokenClassifierPreprocessor(tokenizer, sequence_length, num_classes=num_classes)

    def serving_tokenize(self, texts, tokenizer, tokenize):
        # as TokenClassifierPreprocessor: the text's words (split on whitespace), each on its own
        import tensorflow as tf

        from keras_bertfam.preprocessing.finetuning import tokenize_words
        from keras_bertfam.preprocessing.ragged import merge_rows

        return merge_rows(tokenize_words(tf.strings.split(texts), tokenizer, tokenize))

    def serving_outputs(self, features, outputs):
        return dict(class_outputs(ops.cast(outputs, "float32")),
                    padding_mask=features["padding_mask"])

    def fit(self, *args, class_weight=None, **kwargs):
        """Keras' `fit`; `class_weight` ({class id: weight}, a missing class 1.0) multiplies
        each token's weight by its label's class weight in the training loss and metrics
        (Keras' own reads labels of shape (B, T) as one-hot rows, and refuses it beside the
        preprocessor's token weights). Validation data is not weighted, as in Keras."""
        table = _class_weight_table(class_weight, self.num_classes)
        if table is not None or self.__dict__.get("_class_weight_table") is not None:
            self.train_function = None  # its traced loss holds the table (or none)
        object.__setattr__(self, "_class_weight_table", table)
        try:
            return super().fit(*args, **kwargs)
        finally:
            if table is not None:
                object.__setattr__(self, "_class_weight_table", None)
                self.train_function = None

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        table = self.__dict__.get("_class_weight_table")
        if table is not None and training and y is not None:
            labels = ops.maximum(ops.cast(y, "int32"), 0)  # (< 0: ignored, `_token_weights`)
            weights = ops.take(ops.convert_to_tensor(table), labels)
            sample_weight = weights if sample_weight is None else \
                ops.cast(sample_weight, "float32") * weights
        return super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                    training=training)

    def metric_weights(self, y, y_pred, sample_weight):
        return label_weights(self, y, _token_weights(y, sample_weight)[1])

    def losses_and_metrics(self, y, y_pred, sample_weight):
        logits = ops.cast(y_pred, "float32")
        labels, w = _token_weights(y, sample_weight)
        ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)  # (B, T)
        correct = ops.cast(ops.equal(ops.argmax(logits, axis=-1), labels), "float32")
        loss = _mean(ce, w)
        return loss, {"accuracy": _mean(correct, w)}

    def _prepare(self, x, y=None, sample_weight=None, batch_size=None, training=True, **kwargs):
        check_label_values(y, self.num_classes, what="token label", allow_negative=True)
        return super()._prepare(x, y, sample_weight, batch_size, training, **kwargs)

    def _raw_examples(self, x, y, sample_weight):
        import tensorflow as tf

        words = _words(x)
        if y is None:
            return (words,)
        n_words = self.preprocessor.words_of(words).row_lengths().numpy()
        if not isinstance(y, tf.RaggedTensor):  # lists, arrays, a pandas Series of lists
            rows = y.tolist() if hasattr(y, "tolist") else y
            y = tf.ragged.constant(_without_padding(rows, n_words), dtype=tf.int32)
        _check_one_label_per_word(n_words, y)
        return (words, y) if sample_weight is None else (words, y, sample_weight)

    def predict_words(self, x, batch_size=None):
        """One label per word: the argmax at each word's first piece (words cut by truncation
        get -1)."""
        import numpy as np

        logits = self.predict(x, batch_size=batch_size, verbose=0)
        words = _words(x)
        _, word_index, first, words = self.preprocessor.word_pieces(words)
        out = []
        budget = self.preprocessor.sequence_length - 2
        xlnet = self.packing_layout == "xlnet"  # pieces end 2 before the row's end, left padded
        for b in range(logits.shape[0]):
            labels = np.full(int(words.row_lengths()[b]), -1)
            idx, flags = word_index[b].numpy()[:budget], first[b].numpy()[:budget]
            start = logits.shape[1] - 2 - len(idx) if xlnet else 1
            best = np.argmax(logits[b, start:start + len(idx)], axis=-1)
            labels[idx[flags]] = best[flags]
            out.append(labels.tolist())
        return out


def _class_weight_table(class_weight, num_classes):
    """`fit`'s class_weight {class id: weight} -> float32 weights [num_classes] (a class not
    given: 1.0); None for None."""
    import numpy as np

    if class_weight is None:
        return None
    if not isinstance(class_weight, dict):
        raise ValueError(f"TokenClassifier got class_weight of type "
                         f"{type(class_weight).__name__}: expected a dict {{class id: weight}}.")
    table = np.ones(num_classes, "float32")
    for key, weight in class_weight.items():
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or \
                not 0 <= key < num_classes:
            raise ValueError(f"TokenClassifier got class_weight key {key!r}: expected class ids "
                             f"0 to {num_classes - 1} (num_classes={num_classes}).")
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.number)) or \
                not np.isfinite(weight) or weight < 0:
            raise ValueError(f"TokenClassifier got class_weight {weight!r} for class {key}: "
                             f"expected a finite, non-negative number.")
        table[int(key)] = weight
    return table


def _token_weights(y, sample_weight):
    """(labels, weights) of token labels [B, T]: a label < 0 is ignored, as HF's -100
    (`CrossEntropyLoss`' ignore_index) on special tokens, later pieces and padding of
    preprocessed labels: weight 0, label 0 (a gather at -100 was out of range: an error on
    TensorFlow, a clamped, wrong loss on JAX and PyTorch)."""
    labels = ops.cast(y, "int32")
    valid = ops.greater_equal(labels, 0)
    w = ops.cast(valid, "float32")
    if sample_weight is not None:
        w = w * ops.cast(sample_weight, "float32")
    return ops.where(valid, labels, 0), w


def _words(x):
    """Sentences ([B] strings) or pre-split words (a list of word lists, a RaggedTensor) as a
    tensor the preprocessor takes."""
    import tensorflow as tf

    if isinstance(x, tf.RaggedTensor):
        return x
    return tf.ragged.constant(x) if len(x) and not isinstance(x[0], str) else tf.constant(x)


def _without_padding(rows, n_words):
    """Rows of labels, each cut to its example's word count where the labels cut are all < 0:
    [B, W] labels padded with -1 (TokenClassifierPreprocessor's dense format, which it cuts the
    same way); a row with more labels than words otherwise stays (`_check_one_label_per_word`
    names it)."""
    if len(rows) != len(n_words):
        return rows
    cut = []
    for row, n in zip(rows, n_words):
        tail = row[n:] if isinstance(row, (list, tuple)) else ()
        cut.append(row[:n] if len(tail) and all(
            isinstance(v, (int, float)) and v < 0 for v in tail) else row)
    return cut


def _check_one_label_per_word(n_words, y):
    """In-memory examples: each row of labels ([B, (W)]) as long as its words (`n_words` [B],
    as the preprocessor splits them), named before training (in a dataset the preprocessor's
    in-graph check says the same)."""
    import numpy as np

    if y.ragged_rank != 1:
        return  # checked in the graph
    n_labels = y.row_lengths().numpy()
    if len(n_words) == len(n_labels) and (n_words != n_labels).any():
        i = int(np.argmax(n_words != n_labels))
        raise ValueError(ONE_LABEL_PER_WORD.format(i, n_words[i], n_labels[i]))
