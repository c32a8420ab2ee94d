"""RoBERTa presets (Liu et al. 2019) and HF conversion."""
import functools
import os

from keras_bertfam.models.roberta import ROBERTA_POSITION_OFFSET, RobertaBackbone
from keras_bertfam.presets import checkpoints, integrity
from keras_bertfam.presets.spec import FamilySpec, Preset
from keras_bertfam.presets.vocabularies import (hf_added_tokens, hf_refuse_unread_added_tokens,
                                                hf_special_tokens,
                                                hf_tokenizer_config, hf_tokenizer_json,
                                                tokenizer_options, vocabulary_path)
from keras_bertfam.preprocessing.tokenizers import BytePairTokenizer, _read_bpe_vocabulary

VOCABULARY_FILE = "vocabulary.json"  # keras-hub's BytePairTokenizer asset names
MERGES_FILE = "merges.txt"


def make_byte_pair(spec, assets_dir=None):
    if assets_dir:
        vocab = os.path.join(assets_dir, VOCABULARY_FILE)
        merges = os.path.join(assets_dir, MERGES_FILE)
    else:
        vocab, merges = vocabulary_path(spec["vocabulary"]), vocabulary_path(spec["merges"])
    return BytePairTokenizer(vocabulary=vocab, merges=merges, **tokenizer_options(spec))


def _byte_level(pre_tokenizer):
    """The ByteLevel step of a tokenizer.json's pre_tokenizer (alone or in a Sequence)."""
    steps = (pre_tokenizer or {}).get("pretokenizers") or [pre_tokenizer or {}]
    return next((s for s in steps if s.get("type") == "ByteLevel"), None)


def byte_pair_from_hf(model_dir):
    """vocab.json + merges.txt, or tokenizer.json's BPE "vocab" and "merges" (transformers 5
    saves only it; merges are [a, b] pairs from tokenizers 0.20, "a b" strings before).
    add_prefix_space: tokenizer_config.json's, which transformers 5 applies over tokenizer.json's
    ByteLevel pre-tokenizer (read where the config has none)."""
    cfg = hf_tokenizer_config(model_dir)
    vocab, merges = os.path.join(model_dir, "vocab.json"), os.path.join(model_dir, "merges.txt")
    json_path = os.path.join(model_dir, "tokenizer.json")
    add_prefix_space = False
    spec = None
    if os.path.exists(vocab) and os.path.exists(merges):
        if os.path.exists(json_path):
            spec = integrity.read_json_object(json_path)  # transformers 4 saves all three
        else:
            hf_refuse_unread_added_tokens(model_dir, _read_bpe_vocabulary(vocab), "vocab.json")
    if not (os.path.exists(vocab) and os.path.exists(merges)):
        missing = " and ".join(os.path.basename(p) for p in (vocab, merges)
                               if not os.path.exists(p))
        spec = hf_tokenizer_json(model_dir, "BPE", missing, "byte-level BPE")
        byte_level = _byte_level(spec.get("pre_tokenizer"))
        if byte_level is None:
            raise ValueError(f"{os.path.join(model_dir, 'tokenizer.json')!r} holds a BPE model "
                             f"whose pre_tokenizer {spec.get('pre_tokenizer')!r} is not byte-level "
                             "(ByteLevel): not RoBERTa's tokenizer.")
        add_prefix_space = byte_level.get("add_prefix_space", False)
        vocab = spec["model"]["vocab"]
        merges = [" ".join(m) if isinstance(m, (list, tuple)) else m
                  for m in spec["model"].get("merges", [])]
    tokens = {f"{role}_token": token for role, token in hf_special_tokens(model_dir, spec).items()}
    added = []
    if spec is not None and spec.get("added_tokens"):
        vocab = dict(_read_bpe_vocabulary(vocab))
        defaults = dict(cls_token="<s>", sep_token="</s>", pad_token="<pad>",
                        mask_token="<mask>", unk_token="<unk>")  # BytePairTokenizer's
        new, kept = hf_added_tokens(spec, json_path, vocab, set(dict(defaults, **tokens).values()),
                                    unsupported=("single_word", "lstrip", "rstrip"))
        vocab.update({t: len(vocab) + i for i, t in enumerate(new)})  # HF's ids (checked)
        added = [e["content"] for e in kept]
    try:
        return BytePairTokenizer(
            vocabulary=vocab, merges=merges, added_tokens=added,
            add_prefix_space=bool(cfg.get("add_prefix_space", add_prefix_space)), **tokens)
    except ValueError as e:
        if not added:
            raise
        raise ValueError(f"{json_path!r} adds tokens this tokenizer cannot take: {e}") from e


def roberta_config_from_hf(cfg, token_type_row_0=False):
    """HF RobertaConfig -> RobertaBackbone arguments.

    `token_type_row_0`: a checkpoint of more than one token type (HF's `RobertaConfig()` default
    is 2; roberta-base has 1) loads its row 0, which is all HF's RobertaModel adds when not
    given token_type_ids (its buffer of zeros; RobertaTokenizer returns none) and what our
    single-row table adds to every token (`roberta_backbone_map` reads it)."""
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise checkpoints.CheckpointError(f"hidden_act={cfg['hidden_act']!r} is not RoBERTa's GELU.")
    if cfg.get("pad_token_id", 1) + 1 != ROBERTA_POSITION_OFFSET:
        raise checkpoints.CheckpointError(
            f"pad_token_id={cfg['pad_token_id']}: RobertaBackbone counts positions from "
            f"{ROBERTA_POSITION_OFFSET} (fairseq's padding_idx 1 + 1).")
    types = cfg.get("type_vocab_size", 1)
    if types != 1 and not (token_type_row_0 and types > 1):
        raise checkpoints.CheckpointError(
            f"type_vocab_size={cfg['type_vocab_size']}: RoBERTa has a single token type.")
    return dict(
        vocabulary_size=cfg["vocab_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"],
        hidden_dim=cfg["hidden_size"],
        intermediate_dim=cfg["intermediate_size"],
        dropout=cfg.get("hidden_dropout_prob", 0.1),
        max_sequence_length=cfg["max_position_embeddings"] - ROBERTA_POSITION_OFFSET,
        layer_norm_epsilon=cfg.get("layer_norm_eps", 1e-5),
        initializer_range=cfg.get("initializer_range", 0.02),
    )


# Row 0 of the checkpoint's token-type table (see `roberta_config_from_hf`); exported as is.
token_type_row_0_map = checkpoints.invertible(lambda w: w[:1], lambda w: w)


def roberta_backbone_map(backbone):
    """BERT's layout, reading row 0 of a token-type table of more than one row."""
    return [(v, key, token_type_row_0_map if key == "embeddings.token_type_embeddings.weight"
             else t) for v, key, t in checkpoints.bert_backbone_map(backbone)]


def roberta_config_to_hf(backbone):
    """RobertaBackbone -> HF RobertaConfig dict (the reverse of `roberta_config_from_hf`)."""
    config = checkpoints.bert_config_to_hf(backbone, "roberta", "RobertaModel")
    config.update(max_position_embeddings=backbone.max_sequence_length + ROBERTA_POSITION_OFFSET,
                  type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    return config


def byte_pair_to_hf(tokenizer, model_dir):
    """vocab.json + merges.txt (with the "#version" line that HF's slow GPT-2 reader skips)."""
    import json

    with open(os.path.join(model_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(dict(tokenizer.vocabulary), f, ensure_ascii=False)
    with open(os.path.join(model_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{m}\n" for m in tokenizer.merges))
    checkpoints.write_tokenizer_config(model_dir, "RobertaTokenizer",
                                       add_prefix_space=bool(tokenizer.add_prefix_space))


def _mlm_head(task):
    """`RobertaForMaskedLM`'s `lm_head` (dense, exact GELU, layer_norm, tied decoder + bias)."""
    return checkpoints.mlm_head_map(task.mlm_head, "lm_head.dense", "lm_head.layer_norm",
                                    "lm_head.bias")


# The MLM decoder, tied to the word embeddings and `lm_head.bias` (HF's _tied_weights_keys).
HF_TIED_HEADS = {"lm_head.decoder.weight": "embeddings.word_embeddings.weight",
                 "lm_head.decoder.bias": "lm_head.bias"}


def _text_classifier(task):
    """`RobertaForSequenceClassification`'s `classifier`: its dense + tanh on `<s>` is our
    backbone's pooler (its RobertaModel has none), `out_proj` our head."""
    return (checkpoints.dense(task.backbone.pooler_dense, "classifier.dense")
            + checkpoints.text_classifier_map(task, "classifier.out_proj"))


FAMILY = FamilySpec(
    name="roberta",
    backbone_cls=RobertaBackbone,
    make_tokenizer=make_byte_pair,
    tokenizer_class=BytePairTokenizer,
    tokenizer_files=(VOCABULARY_FILE, MERGES_FILE),
    hf_model_types=("roberta",),
    config_from_hf=functools.partial(roberta_config_from_hf, token_type_row_0=True),
    weights_from_hf=roberta_backbone_map,
    hf_prefixes=("roberta.",),
    tokenizer_from_hf=byte_pair_from_hf,
    config_to_hf=roberta_config_to_hf,
    tokenizer_to_hf=byte_pair_to_hf,
    hf_task_heads={"MaskedLM": _mlm_head, "TextClassifier": _text_classifier,
                   "TokenClassifier": checkpoints.classifier_head_map,
                   "QuestionAnswerer": checkpoints.question_answerer_map,
                   # RobertaForMultipleChoice: RobertaModel's pooler (ours) -> dropout ->
                   # classifier (1 unit)
                   "MultipleChoice": checkpoints.text_classifier_map},
    hf_task_architectures={"MaskedLM": "RobertaForMaskedLM",
                           "TextClassifier": "RobertaForSequenceClassification",
                           "TokenClassifier": "RobertaForTokenClassification",
                           "QuestionAnswerer": "RobertaForQuestionAnswering",
                           "MultipleChoice": "RobertaForMultipleChoice"},
    hf_tied_heads=HF_TIED_HEADS,
)

TOKENIZER = {"kind": "byte_pair", "vocabulary": "roberta_vocab", "merges": "roberta_merges"}


def _roberta(layers, hidden, heads):
    return dict(vocabulary_size=50265, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=4 * hidden, max_sequence_length=512)


PRESETS = [
    Preset("roberta_base_en", "roberta", _roberta(12, 768, 12), TOKENIZER, 124_645_632,
           "FacebookAI/roberta-base", "RoBERTa-Base L12/H768/A12, byte-level BPE 50265"),
    Preset("roberta_large_en", "roberta", _roberta(24, 1024, 16), TOKENIZER, 355_359_744,
           "FacebookAI/roberta-large", "RoBERTa-Large L24/H1024/A16, byte-level BPE 50265"),
]
