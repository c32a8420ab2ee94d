"""Longformer presets (Beltagy et al. 2020) and HF conversion (`LongformerModel` and heads).

Longformer is RoBERTa's layout (same tokenizer, embeddings, blocks and heads) plus three global
projections per layer and the attention window; only those differences live here.
"""
from keras_bertfam.models.longformer import LongformerBackbone
from keras_bertfam.models.roberta import ROBERTA_POSITION_OFFSET
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.families import roberta
from keras_bertfam.presets.spec import FamilySpec, Preset

GLOBAL_PROJECTIONS = (("query_global_dense", "query_global"), ("key_global_dense", "key_global"),
                      ("value_global_dense", "value_global"))


def longformer_config_from_hf(cfg):
    """HF LongformerConfig -> LongformerBackbone arguments (a table of more than one token
    type, HF's `LongformerConfig()` default, loads its row 0, as RoBERTa's)."""
    config = roberta.roberta_config_from_hf(cfg, token_type_row_0=True)
    window = cfg.get("attention_window", 512)
    if isinstance(window, list):
        # HF's LongformerModel refuses a list that is not one window per layer (a one-entry
        # list is not "that window everywhere").
        if len(window) != config["num_layers"]:
            raise checkpoints.CheckpointError(
                f"attention_window={window} has {len(window)} entries for num_layers="
                f"{config['num_layers']} (num_hidden_layers): HF's Longformer takes one int or "
                "one window per layer.")
        if len(set(window)) == 1:
            window = window[0]
    config["attention_window"] = window
    return config


def longformer_backbone_map(backbone):
    """RoBERTa's (BERT's) layout + `attention.self.{query,key,value}_global` per layer."""
    mapping = [(v, key, roberta.token_type_row_0_map
                if key.endswith("token_type_embeddings.weight") else t)
               for v, key, t in checkpoints.bert_embeddings_map(backbone.embeddings)]
    heads = backbone.num_heads
    for i, block in enumerate(backbone.blocks):
        prefix = f"encoder.layer.{i}"
        mapping += checkpoints.bert_layer_map(block, prefix, heads)
        attention = block.attention.attention
        for ours, theirs in GLOBAL_PROJECTIONS:
            layer = getattr(attention, ours)
            key = f"{prefix}.attention.self.{theirs}"
            mapping += [(layer.kernel, key + ".weight", checkpoints.heads_in(heads)),
                        (layer.bias, key + ".bias", checkpoints.heads_in(heads))]
    return mapping + checkpoints.dense(backbone.pooler_dense, "pooler.dense")


def longformer_config_to_hf(backbone):
    _check_hf_runs_windows(backbone.attention_window, backbone.layer_windows)
    config = checkpoints.bert_config_to_hf(backbone, "longformer", "LongformerModel")
    window = backbone.attention_window
    config.update(
        max_position_embeddings=backbone.max_sequence_length + ROBERTA_POSITION_OFFSET,
        type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, sep_token_id=2,
        attention_window=list(window) if isinstance(window, (list, tuple))
        else [window] * backbone.num_layers,
    )
    return config



def _check_hf_runs_windows(attention_window, windows):
    """Windows HF's LongformerModel runs at every length, else a ValueError naming them: it pads
    the inputs to a multiple of the largest window and each layer asserts that the length is a
    multiple of its own window; a window of 2 (one token each side) fails at any length. Ours
    runs all of them (each layer pads to its own w/2)."""
    largest = max(windows)
    problems = [f"layer {i}'s window of 2 (HF's fails on it at any length)"
                for i, w in enumerate(windows) if w == 2]
    problems += [f"layer {i}'s {w} does not divide the largest window, {largest} (HF's pads "
                 f"inputs to a multiple of {largest}; the layer needs a multiple of {w})"
                 for i, w in enumerate(windows) if w != 2 and largest % w]
    if problems:
        raise ValueError(
            f"export_to_transformers cannot write attention_window={attention_window!r} for "
            f"HF's LongformerModel, which would fail on most inputs: {'; '.join(problems)}. "
            "Windows of 4 or more that each divide the largest one export (e.g. [8, 4]); keep "
            "this model with save_to_preset.")

def longformer_param_count(config):
    """Analytic count: RoBERTa's plus 3 (H·H + H) global projections per layer."""
    H, L, I = config["hidden_dim"], config["num_layers"], config["intermediate_dim"]
    positions = config.get("max_sequence_length", 4096) + ROBERTA_POSITION_OFFSET
    embeddings = (config["vocabulary_size"] + positions + 1) * H + 2 * H
    attention = 7 * (H * H + H) + 2 * H  # q, k, v, 3 global, output + LayerNorm
    feedforward = (H * I + I) + (I * H + H) + 2 * H
    return embeddings + L * (attention + feedforward) + (H * H + H)


FAMILY = FamilySpec(
    name="longformer",
    backbone_cls=LongformerBackbone,
    make_tokenizer=roberta.make_byte_pair,
    tokenizer_class=roberta.BytePairTokenizer,
    tokenizer_files=(roberta.VOCABULARY_FILE, roberta.MERGES_FILE),
    hf_model_types=("longformer",),
    config_from_hf=longformer_config_from_hf,
    weights_from_hf=longformer_backbone_map,
    hf_prefixes=("longformer.",),
    tokenizer_from_hf=roberta.byte_pair_from_hf,
    config_to_hf=longformer_config_to_hf,
    tokenizer_to_hf=roberta.byte_pair_to_hf,
    hf_task_heads={"MaskedLM": roberta._mlm_head, "TextClassifier": roberta._text_classifier,
                   "TokenClassifier": checkpoints.classifier_head_map,
                   "QuestionAnswerer": checkpoints.question_answerer_map,
                   # LongformerModel's pooler (ours) -> dropout -> classifier (1 unit)
                   "MultipleChoice": checkpoints.text_classifier_map},
    hf_task_architectures={"MaskedLM": "LongformerForMaskedLM",
                           "TextClassifier": "LongformerForSequenceClassification",
                           "TokenClassifier": "LongformerForTokenClassification",
                           "QuestionAnswerer": "LongformerForQuestionAnswering",
                           "MultipleChoice": "LongformerForMultipleChoice"},
    hf_tied_heads=roberta.HF_TIED_HEADS,
    count_params=longformer_param_count,
)


def _longformer(layers, hidden, heads):
    return dict(vocabulary_size=50265, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=4 * hidden, attention_window=512, max_sequence_length=4096)


PRESETS = [
    Preset("longformer_base_4096", "longformer", _longformer(12, 768, 12), roberta.TOKENIZER,
           148_659_456, "allenai/longformer-base-4096",
           "Longformer-Base L12/H768/A12, window 512, 4,096 tokens, byte-level BPE 50265"),
    Preset("longformer_large_4096", "longformer", _longformer(24, 1024, 16), roberta.TOKENIZER,
           434_600_960, "allenai/longformer-large-4096",
           "Longformer-Large L24/H1024/A16, window 512, 4,096 tokens, byte-level BPE 50265"),
]
