"""DistilBERT preset and HF conversion (HF `DistilBertModel`'s own weight names)."""
import functools

from keras_bertfam.models.distil_bert import DistilBertBackbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.checkpoints import attention, dense, layer_norm
from keras_bertfam.presets.families.bert import (
    UNCASED,
    WordPieceTokenizer,
    make_wordpiece,
    wordpiece_from_hf,
    wordpiece_to_hf,
)
from keras_bertfam.presets.spec import FamilySpec, Preset


def distil_bert_config_from_hf(cfg):
    """HF DistilBertConfig -> DistilBertBackbone arguments."""
    if cfg.get("sinusoidal_pos_embds", False):
        raise checkpoints.CheckpointError("sinusoidal_pos_embds=True is not supported: "
                                          "DistilBertBackbone learns its position table.")
    if cfg.get("activation", "gelu") != "gelu":
        raise checkpoints.CheckpointError(f"activation={cfg['activation']!r} is not exact GELU.")
    return dict(
        vocabulary_size=cfg["vocab_size"],
        num_layers=cfg["n_layers"],
        num_heads=cfg["n_heads"],
        hidden_dim=cfg["dim"],
        intermediate_dim=cfg["hidden_dim"],
        dropout=cfg.get("dropout", 0.1),
        max_sequence_length=cfg["max_position_embeddings"],
        layer_norm_epsilon=1e-12,  # fixed in HF's DistilBERT
        initializer_range=cfg.get("initializer_range", 0.02),
    )


def distil_bert_backbone_map(backbone):
    mapping = checkpoints.bert_embeddings_map(backbone.embeddings)
    for i in range(backbone.num_layers):
        block = backbone.encoder.layer_block(i)
        p = f"transformer.layer.{i}"
        mapping += (
            attention(block.attention.attention,
                      [f"{p}.attention.{n}" for n in ("q_lin", "k_lin", "v_lin", "out_lin")],
                      backbone.num_heads)
            + layer_norm(block.attention.layer_norm, f"{p}.sa_layer_norm")
            + dense(block.feedforward.intermediate_dense, f"{p}.ffn.lin1")
            + dense(block.feedforward.output_dense, f"{p}.ffn.lin2")
            + layer_norm(block.feedforward.layer_norm, f"{p}.output_layer_norm")
        )
    return mapping


def distil_bert_config_to_hf(backbone):
    """DistilBertBackbone -> HF DistilBertConfig dict (the reverse of
    `distil_bert_config_from_hf`)."""
    if backbone.layer_norm_epsilon != 1e-12:
        raise NotImplementedError(
            f"layer_norm_epsilon={backbone.layer_norm_epsilon}: HF's DistilBERT fixes it at 1e-12.")
    attention_dropout = backbone.attention_dropout
    return dict(
        model_type="distilbert",
        architectures=["DistilBertModel"],
        vocab_size=backbone.vocabulary_size,
        n_layers=backbone.num_layers,
        n_heads=backbone.num_heads,
        dim=backbone.hidden_dim,
        hidden_dim=backbone.intermediate_dim,
        dropout=backbone.dropout,
        attention_dropout=backbone.dropout if attention_dropout is None else attention_dropout,
        activation=checkpoints.hf_activation(backbone),
        max_position_embeddings=backbone.max_sequence_length,
        sinusoidal_pos_embds=False,
        initializer_range=backbone.initializer_range,
        pad_token_id=0,
    )


def _mlm_head(task):
    """`DistilBertForMaskedLM`'s vocab_transform, vocab_layer_norm and vocab_projector's bias."""
    return checkpoints.mlm_head_map(task.mlm_head, "vocab_transform", "vocab_layer_norm",
                                    "vocab_projector.bias")


# DistilBertForSequenceClassification and DistilBertForMultipleChoice: pre_classifier -> ReLU on
# [CLS] -> dropout -> classifier
_pre_classifier_head = functools.partial(
    checkpoints.text_classifier_map, hidden="pre_classifier",
    activation=DistilBertBackbone.classifier_hidden_activation)


FAMILY = FamilySpec(
    name="distil_bert",
    backbone_cls=DistilBertBackbone,
    make_tokenizer=make_wordpiece,
    tokenizer_class=WordPieceTokenizer,
    tokenizer_files=("vocab.txt",),
    hf_model_types=("distilbert",),
    config_from_hf=distil_bert_config_from_hf,
    weights_from_hf=distil_bert_backbone_map,
    hf_prefixes=("distilbert.",),
    tokenizer_from_hf=wordpiece_from_hf,
    config_to_hf=distil_bert_config_to_hf,
    tokenizer_to_hf=functools.partial(wordpiece_to_hf, tokenizer_class="DistilBertTokenizer"),
    hf_task_heads={"MaskedLM": _mlm_head,
                   "TextClassifier": _pre_classifier_head,
                   "TokenClassifier": checkpoints.classifier_head_map,
                   "QuestionAnswerer": checkpoints.question_answerer_map,
                   "MultipleChoice": _pre_classifier_head},
    hf_task_architectures={"MaskedLM": "DistilBertForMaskedLM",
                           "TextClassifier": "DistilBertForSequenceClassification",
                           "TokenClassifier": "DistilBertForTokenClassification",
                           "QuestionAnswerer": "DistilBertForQuestionAnswering",
                           "MultipleChoice": "DistilBertForMultipleChoice"},
    hf_tied_heads={"vocab_projector.weight": "embeddings.word_embeddings.weight"},
)

PRESETS = [
    Preset("distil_bert_base_en_uncased", "distil_bert",
           dict(vocabulary_size=30522, num_layers=6, num_heads=12, hidden_dim=768,
                intermediate_dim=3072, max_sequence_length=512),
           UNCASED, 66_362_880, "distilbert/distilbert-base-uncased",
           "DistilBERT base uncased L6/H768/A12, distilled from BERT-Base uncased"),
]
