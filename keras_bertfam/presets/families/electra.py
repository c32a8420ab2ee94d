"""ELECTRA presets (discriminators and generators of the released checkpoints) and HF conversion.

HF `ElectraModel` names its weights as BERT does (`embeddings.*`, `encoder.layer.{i}.*`) plus
`embeddings_project` (the E -> H projection); task checkpoints put `electra.` before them.
"""
import functools

from keras_bertfam.models.electra import ElectraBackbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.families.bert import (
    UNCASED,
    WordPieceTokenizer,
    make_wordpiece,
    wordpiece_from_hf,
    wordpiece_to_hf,
)
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


def electra_config_to_hf(backbone):
    """ElectraBackbone -> HF ElectraConfig dict (the reverse of `electra_config_from_hf`)."""
    return dict(checkpoints.bert_config_to_hf(backbone, "electra", "ElectraModel"),
                embedding_size=backbone.embedding_dim)


def generator_head_map(head):
    """`ElectraForMaskedLM`'s `generator_predictions` (dense H -> E, GELU, LayerNorm) and
    `generator_lm_head` bias (its weight is tied to the word embeddings) -> a `MaskedLMHead`."""
    return checkpoints.mlm_head_map(head, "generator_predictions.dense",
                                    "generator_predictions.LayerNorm", "generator_lm_head.bias")


def discriminator_head_map(head):
    """`ElectraForPreTraining`'s `discriminator_predictions` -> a `ReplacedTokenHead`."""
    return (checkpoints.dense(head.dense, "discriminator_predictions.dense")
            + checkpoints.dense(head.logit, "discriminator_predictions.dense_prediction"))


FAMILY = FamilySpec(
    name="electra",
    backbone_cls=ElectraBackbone,
    make_tokenizer=make_wordpiece,
    tokenizer_class=WordPieceTokenizer,
    tokenizer_files=("vocab.txt",),
    hf_model_types=("electra",),
    config_from_hf=electra_config_from_hf,
    weights_from_hf=electra_backbone_map,
    hf_prefixes=("electra.",),
    tokenizer_from_hf=wordpiece_from_hf,
    config_to_hf=electra_config_to_hf,
    tokenizer_to_hf=functools.partial(wordpiece_to_hf, tokenizer_class="ElectraTokenizer"),
    # A generator checkpoint is an ElectraForMaskedLM: MaskedLM on an ElectraBackbone is the
    # generator alone. ElectraPretrainer takes the discriminator's head from the checkpoint it
    # converts and the generator's from the one given as `generator_preset`.
    hf_task_heads={"MaskedLM": lambda task: generator_head_map(task.mlm_head),
                   "ElectraPretrainer": lambda task: discriminator_head_map(task.rtd_head),
                   # classifier.dense -> GELU on [CLS] -> classifier.out_proj
                   "TextClassifier": functools.partial(
                       checkpoints.text_classifier_map, key="classifier.out_proj",
                       hidden="classifier.dense",
                       activation=ElectraBackbone.classifier_hidden_activation),
                   "TokenClassifier": checkpoints.classifier_head_map,
                   "QuestionAnswerer": checkpoints.question_answerer_map,
                   # sequence_summary (summary_type "first"): summary -> GELU -> dropout;
                   # then classifier (1 unit)
                   "MultipleChoice": functools.partial(
                       checkpoints.text_classifier_map, hidden="sequence_summary.summary",
                       activation=ElectraBackbone.classifier_hidden_activation)},
    hf_head_config=checkpoints.sequence_summary_config(
        "first", ElectraBackbone.classifier_hidden_activation),
    hf_task_architectures={"MaskedLM": "ElectraForMaskedLM",
                           "ElectraPretrainer": "ElectraForPreTraining",
                           "TextClassifier": "ElectraForSequenceClassification",
                           "TokenClassifier": "ElectraForTokenClassification",
                           "QuestionAnswerer": "ElectraForQuestionAnswering",
                           "MultipleChoice": "ElectraForMultipleChoice"},
    hf_task_companions={"ElectraPretrainer": {"generator_preset": (
        "ElectraForMaskedLM", lambda task: generator_head_map(task.mlm_head),
        lambda task: checkpoints.bert_embeddings_map(task.generator.embeddings))}},
    hf_tied_heads={"generator_lm_head.weight": "embeddings.word_embeddings.weight"},
)


def _electra(layers, hidden, heads, embedding, intermediate):
    return dict(vocabulary_size=30522, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=intermediate, embedding_dim=embedding, max_sequence_length=512,
                num_segments=2)


# Sizes of the released checkpoints' HF configs (google/electra-*): the released generators are
# 256 wide at every size (the small one as wide as its discriminator), E the discriminator's.
# Checked against keras-hub's presets converted from those checkpoints
# (keras_hub/src/models/electra/electra_presets.py "params"): each is exactly our count plus a
# tanh pooler H x H + H, which keras-hub's ElectraBackbone has and ours (as HF's) has not:
# small gen/disc 13,548,800 = 13,483,008 + 256·257; base gen 33,576,960 = 33,511,168 + 256·257;
# base disc 109,482,240 = 108,891,648 + 768·769; large gen 51,065,344 = 50,999,552 + 256·257;
# large disc 335,141,888 = 334,092,288 + 1024·1025. So the widths (hidden 256, intermediate
# 1024, E 768 / 1024) are the checkpoints'; the heads (4 = 256 / 64, ELECTRA's
# get_generator_config rule, and ElectraConfig's default) do not change a count.
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
