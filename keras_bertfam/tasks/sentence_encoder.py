"""Sentence embeddings: mean, max or [CLS] pooling + L2 normalization (sentence-transformers)."""
import keras
import numpy as np
from keras import ops

from keras_bertfam.tasks.masked_lm import backbone_inputs
from keras_bertfam.tasks.task import Task


POOLING_MODES = ("mean", "cls", "max")


def check_pooling_mode(pooling_mode):
    if not isinstance(pooling_mode, str) or pooling_mode not in POOLING_MODES:
        raise ValueError(f"pooling_mode must be one of {', '.join(map(repr, POOLING_MODES))}; "
                         f"got pooling_mode={pooling_mode!r}.")


@keras.saving.register_keras_serializable(package="keras_bertfam")
class Pooling(keras.layers.Layer):
    """(B, T, H) states, (B, T) padding mask -> (B, H), optionally L2-normalized:
    sentence-transformers' `Pooling(pooling_mode)` + `Normalize`.

    "mean": the mean over the non-pad tokens (a row of padding only: zeros). "max": the maximum
    over the non-pad tokens (padding never wins; a row of padding only: -inf, as
    sentence-transformers'). "cls": the state at `cls_index` (the family's classification token:
    0, or -1 for XLNet's `<cls>`, which its layout packs last)."""

    def __init__(self, pooling_mode="mean", normalize=True, cls_index=0, **kwargs):
        check_pooling_mode(pooling_mode)  # (before the layer's name, which the mode makes)
        super().__init__(**kwargs)
        self.pooling_mode = pooling_mode
        self.normalize = normalize
        self.cls_index = cls_index

    def call(self, sequence, padding_mask):
        if self.pooling_mode == "cls":
            x = sequence[:, self.cls_index, :]
        elif self.pooling_mode == "max":
            real = ops.cast(padding_mask, "bool")[:, :, None]  # (B, T, 1)
            x = ops.max(ops.where(real, sequence, ops.full_like(sequence, -np.inf)), axis=1)
        else:
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
        return dict(super().get_config(), pooling_mode=self.pooling_mode,
                    normalize=self.normalize, cls_index=self.cls_index)


@keras.saving.register_keras_serializable(package="keras_bertfam")
class MeanPooling(Pooling):
    """`Pooling("mean")` under the name that `.keras` files saved before `pooling_mode` existed
    (SentenceEncoder's "mean_pooling" layer) use."""

    def __init__(self, normalize=True, **kwargs):
        super().__init__(pooling_mode="mean", normalize=normalize, **kwargs)

    def get_config(self):
        config = super().get_config()
        del config["pooling_mode"], config["cls_index"]
        return config


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SentenceEncoder(Task):
    """A backbone + pooling (+ L2 normalization): sentence-transformers' encoder.

    `pooling_mode` (keras-hub's `BertTextEmbedder`'s, sentence-transformers' `Pooling`'s): "mean"
    (the default: the mean over the non-pad tokens), "max" (the maximum over the non-pad tokens)
    or "cls" (the classification token's state, where `TextClassifier` reads it: first, or on
    XLNet `<cls>` last, its rows packed `A <sep> <cls>` on the left).

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

    def __init__(self, backbone, preprocessor=None, pooling_mode="mean", normalize=True,
                 **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.pooling_mode = pooling_mode
        self.normalize = normalize
        self.pooling = Pooling(pooling_mode, normalize,
                               cls_index=getattr(backbone, "cls_token_index", 0),
                               name=f"{pooling_mode}_pooling")
        inputs, features = backbone_inputs(backbone)
        sequence = backbone(features)["sequence_output"]
        embedding = self.pooling(sequence, inputs["padding_mask"])
        super().__init__(inputs=inputs, outputs=embedding, **kwargs)

    @property
    def follows_xlnet_layout(self):
        # "cls" reads the classification token where a TextClassifier reads it: on XLNet,
        # `<cls>` last (`A <sep> <cls>`, padded on the left). Mean and max keep `[CLS] A [SEP]`.
        return self.pooling_mode == "cls"

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
