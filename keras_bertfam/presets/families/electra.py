"""ELECTRA presets (discriminators and generators of the released checkpoints) and HF conversion.

HF `ElectraModel` names its weights as BERT does (`embeddings.*`, `encoder.layer.{i}.*`) plus
`embeddings_project` (the E -> H projection); task checkpoints put `electra.` before them.
"""
from keras_bertfam.models.electra import ElectraBackbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.families.bert import UNCASED, make_wordpiece, wordpiece_from_hf
from keras_bertfam.presets.spec import FamilySpec, Preset


def electra_config_from_hf(cfg):
    """HF ElectraConfig -> ElectraBackbone arguments."""
    config = checkpoints.bert_config_from_hf(cfg)
    config["embedding_dim"] = cfg.get("embedding_size", cfg["hidden_size"])
    return config


def electra_backbone_map(backbone):
    embeddings = backbone.embeddings
    mapping = checkpoints.bert_embeddings_map(embeddings)
    if embeddings.projection is not None:
        mapping += checkpoints.dense(embeddings.projection, "embeddings_project")
    for i in range(backbone.num_layers):
        mapping += checkpoints.bert_layer_map(backbone.encoder.layer_block(i), f"encoder.layer.{i}",
                                              backbone.num_heads)
    return mapping


FAMILY = FamilySpec(
    name="electra",
    backbone_cls=ElectraBackbone,
    make_tokenizer=make_wordpiece,
    tokenizer_files=("vocab.txt",),
    hf_model_types=("electra",),
    config_from_hf=electra_config_from_hf,
    weights_from_hf=electra_backbone_map,
    hf_prefixes=("electra.",),
    tokenizer_from_hf=wordpiece_from_hf,
)


def _electra(layers, hidden, heads, embedding, intermediate):
    return dict(vocabulary_size=30522, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=intermediate, embedding_dim=embedding, max_sequence_length=512,
                num_segments=2)


# Sizes of the released checkpoints' HF configs (google/electra-*): the released generators are
# 256 wide at every size (the small one as wide as its discriminator).
PRESETS = [
    Preset("electra_small_discriminator_uncased_en", "electra",
           _electra(12, 256, 4, 128, 1024), UNCASED, 13_483_008,
           "google/electra-small-discriminator", "ELECTRA-Small discriminator L12/H256/E128/A4"),
    Preset("electra_small_generator_uncased_en", "electra",
           _electra(12, 256, 4, 128, 1024), UNCASED, 13_483_008,
           "google/electra-small-generator", "ELECTRA-Small generator L12/H256/E128/A4"),
    Preset("electra_base_discriminator_uncased_en", "electra",
           _electra(12, 768, 12, 768, 3072), UNCASED, 108_891_648,
           "google/electra-base-discriminator", "ELECTRA-Base discriminator L12/H768/A12"),
    Preset("electra_base_generator_uncased_en", "electra",
           _electra(12, 256, 4, 768, 1024), UNCASED, 33_511_168,
           "google/electra-base-generator", "ELECTRA-Base generator L12/H256/E768/A4"),
    Preset("electra_large_discriminator_uncased_en", "electra",
           _electra(24, 1024, 16, 1024, 4096), UNCASED, 334_092_288,
           "google/electra-large-discriminator", "ELECTRA-Large discriminator L24/H1024/A16"),
    Preset("electra_large_generator_uncased_en", "electra",
           _electra(24, 256, 4, 1024, 1024), UNCASED, 50_999_552,
           "google/electra-large-generator", "ELECTRA-Large generator L24/H256/E1024/A4"),
]
