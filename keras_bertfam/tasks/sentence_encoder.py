"""Sentence embeddings: mean pooling over non-pad tokens + L2 normalization (sentence-transformers)."""
import keras
import numpy as np
from keras import ops

from keras_bertfam.tasks.masked_lm import backbone_inputs
from keras_bertfam.tasks.task import Task


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MeanPooling(keras.layers.Layer):
    """(B, T, H) states, (B, T) padding mask -> (B, H) mean over the non-pad tokens, optionally
    L2-normalized (sentence-transformers' `Pooling(mean)` + `Normalize`)."""

    def __init__(self, normalize=True, **kwargs):
        super().__init__(**kwargs)
        self.normalize = normalize

    def call(self, sequence, padding_mask):
        mask = ops.cast(padding_mask, sequence.dtype)[:, :, None]  # (B, T, 1)
        summed = ops.sum(sequence * mask, axis=1)  # (B, H)
        count = ops.maximum(ops.sum(mask, axis=1), 1e-9)  # (B, 1)
        x = summed / count
        if self.normalize:
            x = x / ops.maximum(ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True)), 1e-12)
        return x

    def compute_output_shape(self, sequence_shape, padding_mask_shape=None):
        return (sequence_shape[0], sequence_shape[-1])

    def get_config(self):
        return dict(super().get_config(), normalize=self.normalize)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SentenceEncoder(Task):
    """A backbone + mean pooling (+ L2 normalization): sentence-transformers' encoder.

    `encode(sentences)` returns (B, H) embeddings (one string: one (H,) vector); with
    `all_minilm_l6_v2` they equal sentence-transformers' `all-MiniLM-L6-v2` (tested ≤ 1e-4;
    sequence length 256 as its `max_seq_length`). Each batch is padded to its longest sentence
    (`pad_to_batch_max=True`, as sentence-transformers pads; the embeddings do not depend on
    the padding). keras-hub's `BertTextEmbedder` methods are here too: `encode_text` and
    `encode_documents` ((B, H), one string a batch of one), `similarity` (dot products). Not
    trained here (no loss); fine-tune a `TextClassifier` instead.

    Example:
    >>> enc = kb.tasks.SentenceEncoder.from_preset("all_minilm_l6_v2")  # doctest: +SKIP
    >>> enc.encode(["A man is eating food."]).shape  # doctest: +SKIP
    (1, 384)
    """

    uses_pooled_output = False  # the pooler is not trained by this task

    preprocessor_args = ("sequence_length", "pad_to_batch_max", "pad_to_multiple_of")

    def __init__(self, backbone, preprocessor=None, normalize=True, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.normalize = normalize
        self.pooling = MeanPooling(normalize=normalize, name="mean_pooling")
        inputs, features = backbone_inputs(backbone)
        sequence = backbone(features)["sequence_output"]
        embedding = self.pooling(sequence, inputs["padding_mask"])
        super().__init__(inputs=inputs, outputs=embedding, **kwargs)

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=256, pad_to_batch_max=True,
                             pad_to_multiple_of="auto", **kwargs):
        from keras_bertfam.preprocessing.finetuning import TextClassifierPreprocessor

        return TextClassifierPreprocessor(tokenizer, sequence_length,
                                          pad_to_batch_max=pad_to_batch_max,
                                          pad_to_multiple_of=pad_to_multiple_of)

    def serving_outputs(self, features, outputs):
        return {"embedding": outputs}

    def losses_and_metrics(self, y, y_pred, sample_weight):
        raise NotImplementedError("SentenceEncoder has no training loss; it encodes sentences.")

    def encode(self, sentences, batch_size=32):
        """Strings -> (B, H) numpy embeddings; one string -> its (H,) embedding; [] -> (0, H)
        (sentence-transformers' `encode`)."""
        if isinstance(sentences, (str, bytes)):
            return self.encode([sentences], batch_size=batch_size)[0]
        sentences = list(sentences)
        if not sentences:
            return np.zeros((0, self.output.shape[-1]), keras.backend.standardize_dtype(
                self.output.dtype))
        return self.predict(sentences, batch_size=batch_size, verbose=0)

    def encode_text(self, text, batch_size=32):
        """keras-hub's `TextEmbedder.encode_text`: a string or strings -> (B, H) embeddings (one
        string: a batch of one)."""
        return self.encode([text] if isinstance(text, (str, bytes)) else text, batch_size)

    def encode_documents(self, documents, batch_size=32):
        """keras-hub's `BertTextEmbedder.encode_documents`: as `encode_text` (the same model
        embeds queries and documents)."""
        return self.encode_text(documents, batch_size)

    def similarity(self, query_embeddings, document_embeddings):
        """(Q, H), (D, H) embeddings -> (Q, D) dot products as numpy (cosine similarities of
        normalized embeddings), keras-hub's `BertTextEmbedder.similarity`."""
        return np.matmul(np.asarray(query_embeddings), np.asarray(document_embeddings).T)
