"""tf.data preprocessing: TensorFlow ops, vectorized over the batch, seeded."""


def _leave_our_functions_to_tensorflow():
    """AutoGraph (which `Dataset.map` and `tf.function` run on the functions they trace) leaves
    keras_bertfam's functions as written, as TensorFlow does for Keras': they are TensorFlow ops
    already (their `if`s and loops are on Python values; the few functions that branch on a
    tensor say so with `tf.cond`), so converting each one cost a source transformation per
    function and process (parse, rewrite, compile) and a `converted_call` on every call inside it
    while tracing. A user's function passed to our pipelines is still converted. TensorFlow has no
    public switch for this; its own tests prepend to the same rule list (converter_testing)."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:  # pragma: no cover - another TensorFlow layout: conversion as before
        return
    rule = config.DoNotConvert("keras_bertfam")
    if not any(getattr(r, "_prefix", None) == "keras_bertfam" for r in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (rule, *config.CONVERSION_RULES)


_leave_our_functions_to_tensorflow()
from keras_bertfam.preprocessing.corpus import read_corpus, split_sentences
from keras_bertfam.preprocessing.finetuning import (
    MultipleChoicePreprocessor,
    QuestionAnswererPreprocessor,
    TextClassifierPreprocessor,
    TokenClassifierPreprocessor,
)
from keras_bertfam.preprocessing.masking import (
    EntityMasker,
    MaskingSchedule,
    NgramMasker,
    PhraseMasker,
    SpanMasker,
    TokenMasker,
    WholeWordMasker,
)
from keras_bertfam.preprocessing.phrases import learn_phrases
from keras_bertfam.preprocessing.offsets import tokenize_with_offsets
from keras_bertfam.preprocessing.packing import (
    DocumentPacker,
    NextSentencePairer,
    SegmentPacker,
    SentenceOrderPairer,
    xlnet_pack,
)
from keras_bertfam.preprocessing.permutation import (
    PermutationMasker,
    XLNetPreprocessor,
)
from keras_bertfam.preprocessing.preprocessors import (
    MaskedLMPreprocessor,
    SentencePairPreprocessor,
)
from keras_bertfam.preprocessing.span_preprocessor import SpanBertPreprocessor
from keras_bertfam.preprocessing.tokenizers import (
    BytePairTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    WordPieceTokenizer,
    XLNetTokenizer,
    train_byte_pair_vocabulary,
    train_sentencepiece_model,
    train_word_piece_vocabulary,
    train_xlnet_sentencepiece_model,
)
