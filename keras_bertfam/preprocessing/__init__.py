"""tf.data preprocessing: TensorFlow ops, vectorized over the batch, seeded."""
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
