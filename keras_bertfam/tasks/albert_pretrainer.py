"""ALBERT pretraining: MLM with n-gram masking + sentence-order prediction (Lan et al. 2020)."""
import math

import keras

from keras_bertfam.tasks.bert_pretrainer import BertPretrainer


@keras.saving.register_keras_serializable(package="keras_bertfam")
class AlbertPretrainer(BertPretrainer):
    """An `AlbertBackbone` + MLM head + sentence-order head; loss = MLM + SOP.

    The same graph and loss as `BertPretrainer` (whose pair head becomes the SOP head: label 1 =
    the two segments were swapped). The MLM transform runs at the embedding width E (Dense(E,
    gelu_new) + LayerNorm) and its output is tied to the V x E token table, as ALBERT's.
    Metrics: `mlm_loss`, `mlm_accuracy`, `sop_loss`, `sop_accuracy`.

    The default preprocessor (`from_preset`, or `default_preprocessor(tokenizer, backbone)`)
    turns raw documents into ALBERT's examples: `SentenceOrderPairer` pairs of consecutive
    segments and `NgramMasker` n-gram masking (n <= 3, p(n) ∝ 1/n) over SentencePiece words.

    Example:
    >>> backbone = kb.models.AlbertBackbone(1000, 2, 2, 16, 32, 64)  # doctest: +SKIP
    >>> pre = AlbertPretrainer.default_preprocessor(tokenizer, backbone, sequence_length=64)  # doctest: +SKIP
    >>> AlbertPretrainer(backbone, preprocessor=pre).fit(documents)  # doctest: +SKIP
    """

    pair_task = "sop"
    backbone_families = ("albert",)

    @classmethod
    def default_preprocessor(cls, tokenizer, backbone, sequence_length=128, masker=None,
                             pairer=None, seed=None, **kwargs):
        from keras_bertfam.preprocessing import (
            NgramMasker,
            SentenceOrderPairer,
            SentencePairPreprocessor,
        )
        from keras_bertfam.preprocessing.preprocessors import word_masking_args

        if masker is None:
            masker = NgramMasker(
                **word_masking_args(tokenizer),
                mask_selection_rate=0.15,
                mask_token_id=tokenizer.mask_token_id,
                mask_selection_length=max(1, math.ceil(0.15 * sequence_length)),
                unselectable_token_ids=tokenizer.special_token_ids,
                padding_token_id=tokenizer.pad_token_id,
                seed=seed,
            )
        if pairer is None:
            pairer = SentenceOrderPairer(sequence_length, seed=seed)
        return SentencePairPreprocessor(tokenizer, sequence_length, masker=masker, pairer=pairer,
                                        seed=seed, **kwargs)
