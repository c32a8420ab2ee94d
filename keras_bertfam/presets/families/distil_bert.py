"""DistilBERT preset and HF conversion (HF `DistilBertModel`'s own weight names)."""
from keras_bertfam.models.distil_bert import DistilBertBackbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.checkpoints import attention, dense, layer_norm
from keras_bertfam.presets.families.bert import UNCASED, make_wordpiece, wordpiece_from_hf
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


FAMILY = FamilySpec(
    name="distil_bert",
    backbone_cls=DistilBertBackbone,
    make_tokenizer=make_wordpiece,
    tokenizer_files=("vocab.txt",),
    hf_model_types=("distilbert",),
    config_from_hf=distil_bert_config_from_hf,
    weights_from_hf=distil_bert_backbone_map,
    hf_prefixes=("distilbert.",),
    tokenizer_from_hf=wordpiece_from_hf,
)

PRESETS = [
    Preset("distil_bert_base_en_uncased", "distil_bert",
           dict(vocabulary_size=30522, num_layers=6, num_heads=12, hidden_dim=768,
                intermediate_dim=3072, max_sequence_length=512),
           UNCASED, 66_362_880, "distilbert/distilbert-base-uncased",
           "DistilBERT base uncased L6/H768/A12, distilled from BERT-Base uncased"),
]
