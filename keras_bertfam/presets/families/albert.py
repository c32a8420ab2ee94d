"""ALBERT presets (Lan et al. 2020, v2 configs) and HF conversion."""
import os

from keras_bertfam.layers.encoder import sharing_plan
from keras_bertfam.models.albert import AlbertBackbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.spec import FamilySpec, Preset
from keras_bertfam.presets.vocabularies import (hf_refuse_unread_added_tokens,
                                                hf_special_tokens, hf_spiece_as_read,
                                                hf_tokenizer_config, hf_tokenizer_json,
                                                hf_unigram_proto, tokenizer_options,
                                                vocabulary_path)
from keras_bertfam.preprocessing.tokenizers import SentencePieceTokenizer

PROTO_FILE = "vocabulary.spm"  # keras-hub's SentencePieceTokenizer asset name
HF_ACTIVATIONS = {"gelu_new": "gelu_approximate", "gelu_pytorch_tanh": "gelu_approximate",
                  "gelu": "gelu", "relu": "relu"}


def make_sentencepiece(spec, assets_dir=None):
    proto = os.path.join(assets_dir, PROTO_FILE) if assets_dir else vocabulary_path(spec["proto"])
    return SentencePieceTokenizer(proto=proto, **tokenizer_options(spec, lowercase=True))


def sentencepiece_from_hf(model_dir, tokenizer_class=SentencePieceTokenizer, lowercase=True,
                          keep_accents=None):
    """spiece.model (its piece types as HF reads them: `hf_spiece_as_read`), or tokenizer.json's
    Unigram model converted back to one (`hf_unigram_proto`: transformers 5 saves no
    spiece.model); lowercasing and accents:
    tokenizer_config.json's `do_lower_case` / `keep_accents`, which transformers 5 applies over
    tokenizer.json's normalizer (read where the config has none; without either `lowercase`,
    accents stripped), or `keep_accents` where given (a family whose HF tokenizer ignores the
    directory's: XLNet's); the special tokens the directory names (`hf_special_tokens`); the
    user-defined pieces cut out of a text, as HF's tokenizer cuts at its added tokens
    (`split_user_defined`)."""
    cfg = hf_tokenizer_config(model_dir)
    proto = os.path.join(model_dir, "spiece.model")
    options = dict(lowercase=lowercase, keep_accents=False)
    if os.path.exists(proto):
        tokens = hf_special_tokens(model_dir)
        hf_refuse_unread_added_tokens(model_dir, _pieces(proto), "spiece.model",
                                      ("added_tokens.json", "tokenizer_config.json",
                                       "tokenizer.json"))
        proto = hf_spiece_as_read(proto, model_dir)
    else:
        spec = hf_tokenizer_json(model_dir, "Unigram", "spiece.model", "SentencePiece",
                                 vocab_type=list)
        proto, options, tokens = hf_unigram_proto(
            model_dir, spec, os.path.join(model_dir, "tokenizer.json"))
    if "do_lower_case" in cfg:
        options["lowercase"] = cfg["do_lower_case"]
    if "keep_accents" in cfg:
        options["keep_accents"] = cfg["keep_accents"]
    if keep_accents is not None:
        options["keep_accents"] = keep_accents
    return tokenizer_class(proto=proto, lowercase=options["lowercase"],
                           keep_accents=options["keep_accents"], split_user_defined=True,
                           **{f"{role}_token": token for role, token in tokens.items()})


def _pieces(proto):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=proto)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def hf_group_of_layer(num_layers, num_groups):
    """HF AlbertTransformer's `int(i / (L / G))` (the original: `int(i / L * G)`)."""
    return [int(i / (num_layers / num_groups)) for i in range(num_layers)]


def _check_groups(layers, groups, error):
    if hf_group_of_layer(layers, groups) != sharing_plan(layers, groups, "all")[0]:
        raise error(
            f"For num_hidden_layers={layers}, num_hidden_groups={groups}, HF's float group "
            "formula int(i / (L / G)) differs from the original int(i / L * G).")


def albert_config_from_hf(cfg):
    """HF AlbertConfig -> AlbertBackbone arguments (all-shared groups, as every ALBERT)."""
    act = cfg.get("hidden_act", "gelu_new")
    if act not in HF_ACTIVATIONS:
        raise checkpoints.CheckpointError(f"hidden_act={act!r} has no AlbertBackbone equivalent.")
    embedding, hidden = cfg.get("embedding_size", 128), cfg["hidden_size"]
    if embedding == hidden:
        raise checkpoints.CheckpointError(
            "embedding_size == hidden_size: HF's ALBERT still has an E->H projection there, "
            "AlbertBackbone (like the paper's E=768 rows) has none.")
    layers, groups = cfg["num_hidden_layers"], cfg.get("num_hidden_groups", 1)
    _check_groups(layers, groups, checkpoints.CheckpointError)
    return dict(
        vocabulary_size=cfg["vocab_size"],
        num_layers=layers,
        num_heads=cfg["num_attention_heads"],
        hidden_dim=hidden,
        intermediate_dim=cfg["intermediate_size"],
        embedding_dim=embedding,
        num_groups=groups,
        num_inner_repetitions=cfg.get("inner_group_num", 1),
        share="all",
        dropout=cfg.get("hidden_dropout_prob", 0.0),
        max_sequence_length=cfg["max_position_embeddings"],
        num_segments=cfg.get("type_vocab_size", 2),
        activation=HF_ACTIVATIONS[act],
        layer_norm_epsilon=cfg.get("layer_norm_eps", 1e-12),
        initializer_range=cfg.get("initializer_range", 0.02),
    )


def albert_backbone_map(backbone):
    """Our AlbertBackbone <- HF AlbertModel names (`albert_layers.r`: block r of a group)."""
    if backbone.share != "all":
        raise checkpoints.CheckpointError(
            f"HF ALBERT shares whole layers; share={backbone.share!r} has no HF counterpart.")
    emb = backbone.embeddings
    mapping = checkpoints.bert_embeddings_map(emb)
    if emb.projection is not None:
        mapping += checkpoints.dense(emb.projection, "encoder.embedding_hidden_mapping_in")
    heads = backbone.num_heads
    repeats = backbone.num_inner_repetitions
    for k, block in enumerate(backbone.encoder.blocks):
        p = f"encoder.albert_layer_groups.{k // repeats}.albert_layers.{k % repeats}"
        attn, ffn = block.attention, block.feedforward
        mapping += (
            checkpoints.attention(attn.attention, [f"{p}.attention.query", f"{p}.attention.key",
                                                   f"{p}.attention.value", f"{p}.attention.dense"],
                                  heads)
            + checkpoints.layer_norm(attn.layer_norm, f"{p}.attention.LayerNorm")
            + checkpoints.dense(ffn.intermediate_dense, f"{p}.ffn")
            + checkpoints.dense(ffn.output_dense, f"{p}.ffn_output")
            + checkpoints.layer_norm(ffn.layer_norm, f"{p}.full_layer_layer_norm")
        )
    if backbone.pooler_dense is not None:
        mapping += checkpoints.dense(backbone.pooler_dense, "pooler")
    return mapping


def albert_config_to_hf(backbone):
    """AlbertBackbone -> HF AlbertConfig dict (the reverse of `albert_config_from_hf`)."""
    if backbone.share != "all" or backbone.embedding_dim == backbone.hidden_dim:
        raise NotImplementedError(
            "HF's ALBERT shares whole layers and always projects E -> H: share="
            f"{backbone.share!r}, E={backbone.embedding_dim}, H={backbone.hidden_dim} has no HF "
            "counterpart.")
    groups = backbone.num_groups or 1
    _check_groups(backbone.num_layers, groups, NotImplementedError)
    config = checkpoints.bert_config_to_hf(backbone, "albert", "AlbertModel")
    config.update(embedding_size=backbone.embedding_dim, num_hidden_groups=groups,
                  inner_group_num=backbone.num_inner_repetitions, classifier_dropout_prob=backbone.dropout,
                  pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return config


def sentencepiece_to_hf(tokenizer, model_dir, tokenizer_class="AlbertTokenizer"):
    """spiece.model + tokenizer_config.json (its lowercasing and accent options)."""
    checkpoints.save_asset_as(tokenizer, model_dir, {PROTO_FILE: "spiece.model"})
    checkpoints.write_tokenizer_config(model_dir, tokenizer_class,
                                       do_lower_case=bool(tokenizer.lowercase),
                                       keep_accents=bool(tokenizer.keep_accents))


def albert_mlm_head_map(head, prefix="predictions"):
    """HF AlbertForMaskedLM's `predictions.{dense, LayerNorm, bias}` -> our MaskedLMHead (at E)."""
    return checkpoints.mlm_head_map(head, f"{prefix}.dense", f"{prefix}.LayerNorm",
                                    f"{prefix}.bias")


HF_TASK_HEADS = {
    "MaskedLM": lambda task: albert_mlm_head_map(task.mlm_head),
    # AlbertForPreTraining: the MLM head and the SOP head on the pooled output.
    "AlbertPretrainer": lambda task: (albert_mlm_head_map(task.mlm_head) + checkpoints.dense(
        task.pair_head.dense, "sop_classifier.classifier")),
    "TextClassifier": checkpoints.text_classifier_map,
    "TokenClassifier": checkpoints.classifier_head_map,
    "QuestionAnswerer": checkpoints.question_answerer_map,
    "MultipleChoice": checkpoints.text_classifier_map,  # pooler -> dropout -> classifier
}
HF_TASK_ARCHITECTURES = {"MaskedLM": "AlbertForMaskedLM",
                         "AlbertPretrainer": "AlbertForPreTraining",
                         "TextClassifier": "AlbertForSequenceClassification",
                         "TokenClassifier": "AlbertForTokenClassification",
                         "QuestionAnswerer": "AlbertForQuestionAnswering",
                         "MultipleChoice": "AlbertForMultipleChoice"}


FAMILY = FamilySpec(
    name="albert",
    backbone_cls=AlbertBackbone,
    make_tokenizer=make_sentencepiece,
    tokenizer_class=SentencePieceTokenizer,
    tokenizer_files=(PROTO_FILE,),
    hf_model_types=("albert",),
    config_from_hf=albert_config_from_hf,
    weights_from_hf=albert_backbone_map,
    hf_prefixes=("albert.",),
    tokenizer_from_hf=sentencepiece_from_hf,
    config_to_hf=albert_config_to_hf,
    tokenizer_to_hf=sentencepiece_to_hf,
    hf_task_heads=HF_TASK_HEADS,
    hf_task_architectures=HF_TASK_ARCHITECTURES,
    # the MLM decoder, tied to the word embeddings and `predictions.bias` (HF's _tied_weights_keys)
    hf_tied_heads={"predictions.decoder.weight": "embeddings.word_embeddings.weight",
                   "predictions.decoder.bias": "predictions.bias"},
)

TOKENIZER = {"kind": "sentencepiece", "proto": "albert_spiece", "lowercase": True}


def _albert(layers, hidden, heads, intermediate):
    return dict(vocabulary_size=30000, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=intermediate, embedding_dim=128, num_groups=1, share="all",
                max_sequence_length=512, num_segments=2)


# Parameter counts are those these configs build (equal to HF AlbertModel's, tested); the paper's
# size table says 12M / 18M / 60M / 235M: the first two agree, xlarge and xxlarge do not (58.7M
# and 222.6M are what L24/H2048 and L12/H4096 with E=128 hold).
PRESETS = [
    Preset("albert_base_en_uncased", "albert", _albert(12, 768, 12, 3072), TOKENIZER,
           11_683_584, "albert/albert-base-v2", "ALBERT-Base L12/H768/E128, all layers shared"),
    Preset("albert_large_en_uncased", "albert", _albert(24, 1024, 16, 4096), TOKENIZER,
           17_683_968, "albert/albert-large-v2", "ALBERT-Large L24/H1024/E128"),
    Preset("albert_extra_large_en_uncased", "albert", _albert(24, 2048, 16, 8192), TOKENIZER,
           58_724_864, "albert/albert-xlarge-v2", "ALBERT-xlarge L24/H2048/E128"),
    Preset("albert_extra_extra_large_en_uncased", "albert", _albert(12, 4096, 64, 16384),
           TOKENIZER, 222_595_584, "albert/albert-xxlarge-v2",
           "ALBERT-xxlarge L12/H4096/E128/A64"),
]
