"""Raw text -> SpanBERT pretraining examples (span masking + the span boundary inputs)."""
import math

import keras

from keras_bertfam.preprocessing.masking import SpanMasker, span_boundaries
from keras_bertfam.preprocessing.preprocessors import (
    MaskedLMPreprocessor,
    deserialize_stage,
    word_masking_args,
)


def default_span_masker(tokenizer, sequence_length, mask_selection_rate=0.15, seed=None,
                        **kwargs):
    """SpanBERT's masking for this tokenizer: spans of Geometric(0.2) whole words clipped to
    [1, 10], budget ceil(0.15 · length), 80/10/10 per span, never a special token."""
    return SpanMasker(
        **word_masking_args(tokenizer),
        mask_selection_rate=mask_selection_rate,
        mask_token_id=tokenizer.mask_token_id,
        mask_selection_length=max(1, math.ceil(sequence_length * mask_selection_rate)),
        unselectable_token_ids=tokenizer.special_token_ids,
        padding_token_id=tokenizer.pad_token_id,
        seed=seed,
        **kwargs,
    )


@keras.saving.register_keras_serializable(package="keras_bertfam")
class SpanBertPreprocessor(MaskedLMPreprocessor):
    """`MaskedLMPreprocessor` with a `SpanMasker` (default) whose x also holds `span_starts` and
    `span_ends` [B, P] (`span_boundaries`): the inputs of `SpanBertPretrainer`. Single segment
    (each string one example, or `packing="doc_sentences"` blocks within one document)."""

    def __init__(self, tokenizer, sequence_length=128, masker=None, packing="segments",
                 batch_size=32, seed=None, **kwargs):
        masker = deserialize_stage(masker) or default_span_masker(tokenizer, sequence_length,
                                                                  seed=seed)
        super().__init__(tokenizer, sequence_length, masker=masker, packing=packing,
                         batch_size=batch_size, seed=seed, **kwargs)

    def _mask(self, token_ids, segment_ids, padding_mask, seed=None):
        extra = {} if seed is None else {"seed": seed}
        x, mask_ids, mask_weights = super()._mask(token_ids, segment_ids, padding_mask, **extra)
        x["span_starts"], x["span_ends"] = span_boundaries(x["mask_positions"], mask_weights)
        return x, mask_ids, mask_weights
