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
    word (lists of lists). `predict` returns logits (B, T, num_classes); `predict_words` returns
    one label per word.

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

    def metric_weights(self, y, y_pred, sample_weight):
        return label_weights(self, y, sample_weight)

    def losses_and_metrics(self, y, y_pred, sample_weight):
        logits = ops.cast(y_pred, "float32")
        labels = ops.cast(y, "int32")
        w = ops.ones_like(labels, "float32") if sample_weight is None else ops.cast(
            sample_weight, "float32")
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
        if not isinstance(y, tf.RaggedTensor):  # lists, arrays, a pandas Series of lists
            y = tf.ragged.constant(y.tolist() if hasattr(y, "tolist") else y, dtype=tf.int32)
        _check_one_label_per_word(self.preprocessor.words_of(words), y)
        return (words, y) if sample_weight is None else (words, y, sample_weight)

    def predict_words(self, x, batch_size=None):
        """One label per word: the argmax at each word's first piece (words cut by truncation
        get -1)."""
        import numpy as np
        import tensorflow as tf

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


def _words(x):
    """Sentences ([B] strings) or pre-split words (a list of word lists, a RaggedTensor) as a
    tensor the preprocessor takes."""
    import tensorflow as tf

    if isinstance(x, tf.RaggedTensor):
        return x
    return tf.ragged.constant(x) if len(x) and not isinstance(x[0], str) else tf.constant(x)


def _check_one_label_per_word(words, y):
    """In-memory examples: each row of labels ([B, (W)]) as long as its words ([B, (W)], as the
    preprocessor splits them), named before training (in a dataset the preprocessor's in-graph
    check says the same)."""
    import numpy as np

    if y.ragged_rank != 1:
        return  # checked in the graph
    n_words, n_labels = words.row_lengths().numpy(), y.row_lengths().numpy()
    if len(n_words) == len(n_labels) and (n_words != n_labels).any():
        i = int(np.argmax(n_words != n_labels))
        raise ValueError(ONE_LABEL_PER_WORD.format(i, n_words[i], n_labels[i]))
