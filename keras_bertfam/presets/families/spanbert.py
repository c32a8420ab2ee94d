"""SpanBERT presets. The public checkpoints are BERT-format HF directories (model_type "bert",
which the bert family converts when given a directory); the registered names below load them as
`SpanBertBackbone`s with BERT's weight mapping."""
from keras_bertfam.models.spanbert import SpanBertBackbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.families.bert import (
    CASED,
    HF_TIED_HEADS,
    HF_TASK_ARCHITECTURES,
    HF_TASK_HEADS,
    HF_UNEXPORTED_LAYERS,
    WordPieceTokenizer,
    make_wordpiece,
    wordpiece_from_hf,
    wordpiece_to_hf,
)
from keras_bertfam.presets.spec import FamilySpec, Preset

FAMILY = FamilySpec(
    name="spanbert",
    backbone_cls=SpanBertBackbone,
    make_tokenizer=make_wordpiece,
    tokenizer_class=WordPieceTokenizer,
    tokenizer_files=("vocab.txt",),
    hf_model_types=(),  # "bert" belongs to the bert family
    config_from_hf=checkpoints.bert_config_from_hf,
    weights_from_hf=checkpoints.bert_backbone_map,
    hf_prefixes=("bert.",),
    tokenizer_from_hf=wordpiece_from_hf,
    # Exported as what the public SpanBERT checkpoints are: BERT-format, model_type "bert".
    config_to_hf=checkpoints.bert_config_to_hf,
    tokenizer_to_hf=wordpiece_to_hf,
    hf_task_heads=HF_TASK_HEADS,
    hf_task_architectures=HF_TASK_ARCHITECTURES,
    hf_tied_heads=HF_TIED_HEADS,
    hf_unexported_layers=HF_UNEXPORTED_LAYERS,
)


def _spanbert(layers, hidden, heads):
    return dict(vocabulary_size=28996, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=4 * hidden, max_sequence_length=512, num_segments=2)


PRESETS = [
    Preset("spanbert_base_en", "spanbert", _spanbert(12, 768, 12), CASED, 108_310_272,
           "SpanBERT/spanbert-base-cased", "SpanBERT base cased L12/H768/A12"),
    Preset("spanbert_large_en", "spanbert", _spanbert(24, 1024, 16), CASED, 333_579_264,
           "SpanBERT/spanbert-large-cased", "SpanBERT large cased L24/H1024/A16"),
]
