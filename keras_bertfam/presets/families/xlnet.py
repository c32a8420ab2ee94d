"""XLNet presets (Yang et al. 2019, cased) and conversion from HF `XLNetModel`, `XLNetLMHeadModel`
and the `XLNetFor*` fine-tuning heads (question answering: `XLNetForQuestionAnsweringSimple`).

HF keeps XLNet's (H, N, Dh) projection layout, which `RelativeMultiHeadAttention` uses too, so
attention weights copy without transforms; only the FFN's torch Linear kernels are transposed.
"""
import functools
import os

from keras_bertfam.models.xlnet import XLNetBackbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.families import albert
from keras_bertfam.presets.spec import FamilySpec, Preset
from keras_bertfam.presets.vocabularies import hf_tokenizer_config, tokenizer_options
from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer
from keras_bertfam.user_warnings import warn

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_approximate", "relu": "relu"}


def xlnet_config_from_hf(cfg):
    """HF XLNetConfig -> XLNetBackbone arguments."""
    if cfg.get("attn_type", "bi") != "bi":
        raise checkpoints.CheckpointError(
            f"attn_type={cfg['attn_type']!r}: only XLNet's bidirectional attention ('bi') is "
            "supported.")
    activation = cfg.get("ff_activation", "gelu")
    if activation not in ACTIVATIONS:
        raise checkpoints.CheckpointError(f"ff_activation={activation!r} is not supported.")
    return dict(
        vocabulary_size=cfg["vocab_size"],
        num_layers=cfg["n_layer"],
        num_heads=cfg["n_head"],
        hidden_dim=cfg["d_model"],
        intermediate_dim=cfg["d_inner"],
        dropout=cfg.get("dropout", 0.1),
        activation=ACTIVATIONS[activation],
        bi_data=cfg.get("bi_data", False),
        clamp_len=cfg.get("clamp_len", -1),
        mem_len=cfg.get("mem_len"),
        reuse_len=cfg.get("reuse_len"),
        untie_r=cfg.get("untie_r", True),
        layer_norm_epsilon=cfg.get("layer_norm_eps", 1e-12),
        initializer_range=cfg.get("initializer_range", 0.02),
    )


def xlnet_backbone_map(backbone):
    """[(variable, HF key, transform)] for an `XLNetModel` state dict (after the `transformer.`
    prefix is stripped). With `untie_r=False` the shared biases come from layer 0 (HF stores one
    copy per layer)."""
    mapping = [(backbone.word_embedding.embeddings, "word_embedding.weight", None),
               (backbone.mask_embedding.mask_emb, "mask_emb", None)]
    for i in range(backbone.num_layers):
        p = f"layer.{i}"
        attn = backbone.attention_layers[i].attention
        for name in ("q", "k", "v", "o", "r", "seg_embed"):
            mapping.append((getattr(attn, name), f"{p}.rel_attn.{name}", None))
        if backbone.untie_r or i == 0:
            for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
                mapping.append((getattr(attn.biases, name), f"{p}.rel_attn.{name}", None))
        mapping += checkpoints.layer_norm(attn.layer_norm, f"{p}.rel_attn.layer_norm")
        ff = backbone.feedforward_layers[i]
        mapping += checkpoints.dense(ff.intermediate_dense, f"{p}.ff.layer_1")
        mapping += checkpoints.dense(ff.output_dense, f"{p}.ff.layer_2")
        mapping += checkpoints.layer_norm(ff.layer_norm, f"{p}.ff.layer_norm")
    return mapping


def xlnet_shared_bias_copies(backbone):
    """With `untie_r=False` the relative biases of layers 1.. are HF's copies of layer 0's, which
    the backbone shares: read from layer 0, declared unused for the others."""
    if backbone.untie_r:
        return ()
    return [f"layer.{i}.rel_attn.{name}" for i in range(1, backbone.num_layers)
            for name in ("r_w_bias", "r_r_bias", "r_s_bias")]


def xlnet_config_to_hf(backbone):
    """XLNetBackbone -> HF XLNetConfig dict (the reverse of `xlnet_config_from_hf`)."""
    if not backbone.untie_r:
        raise NotImplementedError(
            "untie_r=False: HF's XLNet keeps one set of relative biases per layer whatever its "
            "config says, so shared biases have no HF layout to export to.")
    activations = {ours: hf for hf, ours in ACTIVATIONS.items()}
    return dict(
        model_type="xlnet",
        architectures=["XLNetModel"],
        vocab_size=backbone.vocabulary_size,
        n_layer=backbone.num_layers,
        n_head=backbone.num_heads,
        d_model=backbone.hidden_dim,
        d_inner=backbone.intermediate_dim,
        dropout=backbone.dropout,
        ff_activation=activations[backbone.activation],
        attn_type="bi",
        bi_data=backbone.bi_data,
        clamp_len=backbone.clamp_len,
        mem_len=backbone.mem_len,
        reuse_len=backbone.reuse_len,
        untie_r=True,
        layer_norm_eps=backbone.layer_norm_epsilon,
        initializer_range=backbone.initializer_range,
        pad_token_id=5, bos_token_id=1, eos_token_id=2,
    )


def xlnet_lm_head_map(bias_variable):
    """`XLNetLMHeadModel`'s output bias (its weight is tied to the word embedding)."""
    return [(bias_variable, "lm_loss.bias", None)]


PROTO_FILE = "vocabulary.spm"  # keras-hub's SentencePieceTokenizer asset name (save_assets)


def make_sentencepiece(spec, assets_dir=None):
    """The tokenizer of a preset: from a saved preset's assets, or a model file named in `spec`."""
    if assets_dir:
        proto = os.path.join(assets_dir, PROTO_FILE)
        if not os.path.exists(proto):  # an HF-style file name in a hand-made preset dir
            proto = os.path.join(assets_dir, "spiece.model")
    else:
        proto = spec.get("proto")
    if proto is None or not os.path.exists(proto):
        raise FileNotFoundError(
            "XLNet's SentencePiece model (spiece.model) is not installed offline: load the "
            "tokenizer from an HF-format directory that has spiece.model or from a saved preset "
            "directory, or train one on your corpus "
            "(keras_bertfam.preprocessing.train_xlnet_sentencepiece_model).")
    return XLNetTokenizer(proto=proto, **tokenizer_options(spec))


def sentencepiece_from_hf(model_dir):
    """`XLNetTokenizer` from an HF-format directory: ALBERT's (`albert.sentencepiece_from_hf`:
    spiece.model or tokenizer.json), HF XLNet's default `do_lower_case` False, accents stripped
    whatever the directory says: transformers 5's `XLNetTokenizer` (the class AutoTokenizer and
    `XLNetTokenizer.from_pretrained` both give) builds NFKD + StripAccents in its constructor,
    ignoring tokenizer_config.json's `keep_accents` and tokenizer.json's normalizer, so HF's ids
    of accented text are those. A directory asking to keep them (which the original XLNet's
    `preprocess_text` and transformers 4 did) is warned about."""
    if hf_tokenizer_config(model_dir).get("keep_accents"):
        warn(
            f"{model_dir}: tokenizer_config.json sets keep_accents=True, which transformers 5's "
            "XLNetTokenizer ignores: it strips accents (NFKD, combining marks dropped), and so "
            "does this tokenizer, to give HF's ids. For the original XLNet's kept accents, build "
            "kb.preprocessing.XLNetTokenizer(..., keep_accents=True) yourself.")
    return albert.sentencepiece_from_hf(model_dir, XLNetTokenizer, lowercase=False,
                                        keep_accents=False)


def sentencepiece_to_hf(tokenizer, model_dir):
    """ALBERT's files (`albert.sentencepiece_to_hf`) as an HF `XLNetTokenizer`'s; a tokenizer
    keeping accents is warned about: transformers 5 strips them (`sentencepiece_from_hf`)."""
    if tokenizer.keep_accents:
        warn(
            "This XLNetTokenizer keeps accents (keep_accents=True): tokenizer_config.json records "
            "it, but transformers 5's XLNetTokenizer ignores it and strips accents, so HF's ids "
            "of accented text (and this directory's, loaded here again) differ from this "
            "tokenizer's.")
    albert.sentencepiece_to_hf(tokenizer, model_dir, tokenizer_class="XLNetTokenizer")


def xlnet_param_count(config):
    """Parameters of `XLNetBackbone(**config)`, without building it: the word table and the
    query stream's start vector; per layer q, k, v, o, r ([H, N, Dh] each, N * Dh = H), the
    segment embedding ([2, N, Dh]), the three relative biases ([N, Dh] each; once for the model
    when `untie_r=False`), the attention's LayerNorm and the feed-forward block."""
    H, I, L = config["hidden_dim"], config["intermediate_dim"], config["num_layers"]
    attention = 5 * H * H + 2 * H + 2 * H
    feedforward = (H * I + I) + (I * H + H) + 2 * H
    biases = 3 * H * (L if config.get("untie_r", True) else 1)
    return config["vocabulary_size"] * H + H + L * (attention + feedforward) + biases


# XLNetForSequenceClassification and XLNetForMultipleChoice: sequence_summary (the last position,
# `<cls>`) -> summary Linear -> tanh -> dropout -> logits_proj
_summary_head = functools.partial(checkpoints.text_classifier_map, key="logits_proj",
                                  hidden="sequence_summary.summary",
                                  activation=XLNetBackbone.classifier_hidden_activation)


FAMILY = FamilySpec(
    hf_unused_of=xlnet_shared_bias_copies,
    name="xlnet",
    backbone_cls=XLNetBackbone,
    make_tokenizer=make_sentencepiece,
    tokenizer_class=XLNetTokenizer,
    tokenizer_files=(PROTO_FILE,),
    hf_model_types=("xlnet",),
    config_from_hf=xlnet_config_from_hf,
    weights_from_hf=xlnet_backbone_map,
    hf_prefixes=("transformer.",),
    tokenizer_from_hf=sentencepiece_from_hf,
    config_to_hf=xlnet_config_to_hf,
    tokenizer_to_hf=sentencepiece_to_hf,
    hf_task_heads={"XLNetPretrainer": lambda task: xlnet_lm_head_map(task.lm_head.bias),
                   "TextClassifier": _summary_head,
                   "TokenClassifier": checkpoints.classifier_head_map,
                   "QuestionAnswerer": checkpoints.question_answerer_map,
                   "MultipleChoice": _summary_head},
    hf_head_config=checkpoints.sequence_summary_config(
        "last", XLNetBackbone.classifier_hidden_activation),
    hf_task_architectures={"XLNetPretrainer": "XLNetLMHeadModel",
                           "TextClassifier": "XLNetForSequenceClassification",
                           "TokenClassifier": "XLNetForTokenClassification",
                           "QuestionAnswerer": "XLNetForQuestionAnsweringSimple",
                           "MultipleChoice": "XLNetForMultipleChoice"},
    hf_other_architectures={"QuestionAnswerer": {
        "XLNetForQuestionAnswering": "HF's beam-search SQuAD head (start_n_top / end_n_top "
                                     "candidates, an end head conditioned on each start, "
                                     "answer_class), another model than QuestionAnswerer's one "
                                     "Linear over the hidden states"}},
    hf_tied_heads={"lm_loss.weight": "word_embedding.weight"},
    count_params=xlnet_param_count,
)

CASED = {"kind": "sentencepiece", "vocabulary": "xlnet_cased", "lowercase": False}


def _xlnet(layers, hidden, heads):
    # HF XLNetConfig defaults for the rest (the public checkpoints' configs): untie_r, no bi_data,
    # clamp_len -1, exact GELU.
    return dict(vocabulary_size=32000, num_layers=layers, num_heads=heads, hidden_dim=hidden,
                intermediate_dim=4 * hidden)


PRESETS = [
    Preset("xlnet_base_en", "xlnet", _xlnet(12, 768, 12), CASED, 116_718_336,
           "xlnet/xlnet-base-cased", "XLNet-Base cased L12/H768/A12"),
    Preset("xlnet_large_en", "xlnet", _xlnet(24, 1024, 16), CASED, 360_268_800,
           "xlnet/xlnet-large-cased", "XLNet-Large cased L24/H1024/A16"),
]
