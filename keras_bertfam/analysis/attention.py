"""Attention maps of raw strings, and the per-head statistics of Clark et al. 2019."""
import dataclasses
import string

import numpy as np

from keras_bertfam.analysis._common import (
    backbone_of, banded_attention, family_name, to_numpy)
from keras_bertfam.user_warnings import warn

_PUNCTUATION = set(string.punctuation) | {"``", "''", "\u2019", "\u2018", "\u201c", "\u201d"}
# Word-piece markers of the families' tokenizers (WordPiece, SentencePiece, byte-level BPE).
_MARKERS = ("##", "\u2581", "\u0120")


@dataclasses.dataclass
class AttentionMaps:
    """Per text: its tokens and, per layer, the (N_l, T, T) attention probabilities (query rows,
    key columns; N_l heads in layer l, fewer than the model's in a pruned layer)."""

    tokens: list  # [text][position] str
    maps: list  # [text][layer] float32 array (N_l, T, T)
    special: list  # [text] dict role -> bool array (T,): "cls", "sep"
    family: str

    def __len__(self):
        return len(self.tokens)

    @property
    def num_layers(self):
        return len(self.maps[0]) if self.maps else 0

    def statistics(self):
        return attention_statistics(self)


def _tokenizer_of(model, tokenizer):
    if tokenizer is not None:
        if isinstance(tokenizer, str):
            from keras_bertfam.preprocessing import Tokenizer

            return Tokenizer.from_preset(tokenizer)
        return tokenizer
    preprocessor = getattr(model, "preprocessor", None)
    found = getattr(preprocessor, "tokenizer", None)
    if found is None:
        raise ValueError(
            f"attention_maps needs a tokenizer for raw strings: {type(model).__name__} has no "
            "preprocessor with one; pass tokenizer= (a kb.preprocessing tokenizer or a preset).")
    return found


def encode(backbone, tokenizer, text, max_length=None):
    """One raw string -> (backbone inputs of batch 1, tokens, special-role flags, truncated?).

    The family's layout: `[CLS] text [SEP]` (BERT-like), `text <sep> <cls>` (XLNet). Texts longer
    than `max_length` (default: the backbone's positions) lose their tail."""
    limit = max_length or getattr(backbone, "max_sequence_length", None) or 512
    ids = [int(i) for i in np.asarray(tokenizer([text])[0]).reshape(-1)]  # tf.data-side
    cls_id, sep_id = int(tokenizer.cls_token_id), int(tokenizer.sep_token_id)
    truncated = len(ids) + 2 > limit
    ids = ids[: max(limit - 2, 0)]
    xlnet = getattr(backbone, "family", None) == "xlnet"
    if xlnet:
        ids = ids + [sep_id, cls_id]
        segment = [0] * (len(ids) - 1) + [2]
    else:
        ids = [cls_id] + ids + [sep_id]
        segment = [0] * len(ids)
    tokens = [tokenizer.id_to_token(i) for i in ids]
    arr = np.asarray([ids], "int32")
    inputs = {"token_ids": arr, "segment_ids": np.asarray([segment], "int32"),
              "padding_mask": np.ones_like(arr)}
    if getattr(backbone, "num_segments", 2) == 0:
        inputs.pop("segment_ids")
    special = {"cls": np.asarray(ids) == cls_id, "sep": np.asarray(ids) == sep_id}
    return inputs, tokens, special, truncated


def attention_maps(model, texts, tokenizer=None, max_length=None, progress=None):
    """Per layer and head, the (T, T) attention probabilities of each raw string, with its tokens.

    Args:
        model: a task (its preprocessor's tokenizer is used) or a backbone of any family
            (XLNet: its content stream's attention over the sequence).
        texts: a string or a list of strings. One forward pass each, unpadded.
        tokenizer: a kb tokenizer or preset name, for a backbone (or to override the task's).
        max_length: truncate longer texts (default and maximum: the backbone's positions), with a
            warning naming how many texts were cut.
        progress: optional callable `progress(i)` after each text (the CLI's progress bar).

    Returns:
        `AttentionMaps` (`.tokens`, `.maps[text][layer]` (N, T, T), `.statistics()`).
    """
    backbone = backbone_of(model, "attention_maps")
    if not hasattr(backbone, "inspect"):
        raise ValueError(f"The {family_name(backbone)!r} family ({type(backbone).__name__}) "
                         "cannot return attention probabilities.")
    if banded_attention(backbone):
        raise ValueError(
            f"attention_maps does not take the {family_name(backbone)!r} family "
            f"({type(backbone).__name__}): its sliding-window attention gives banded "
            "probabilities, (N, T, G + w + 1) per layer (global-key columns, then the window), "
            "not the (N, T, T) maps the statistics and plots read; backbone.inspect(...) "
            "returns them as they are.")
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    elif isinstance(texts, np.ndarray):
        texts = texts.reshape(-1).tolist()
    elif not hasattr(texts, "__iter__") or isinstance(texts, dict):
        raise ValueError(f"texts must be a string or a list of strings, got "
                         f"{type(texts).__name__} {texts!r}.")
    texts = [t.decode("utf-8") if isinstance(t, bytes) else t for t in texts]
    if not texts:
        raise ValueError("attention_maps takes a non-empty list of strings, got none.")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"texts[{i}] is {t!r} ({type(t).__name__}): attention_maps takes "
                             "a non-empty list of strings.")
    positions = getattr(backbone, "max_sequence_length", None)
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(
            max_length, (int, np.integer))):
        raise ValueError(f"max_length must be an int (tokens), got {max_length!r}.")
    if max_length is not None and (max_length < 3 or (positions and max_length > positions)):
        raise ValueError(f"max_length must be in [3, {positions}] (the model's positions), got "
                         f"{max_length}.")
    tokenizer = _tokenizer_of(model, tokenizer)
    tokens, maps, special, cut = [], [], [], 0
    for i, text in enumerate(texts):
        inputs, toks, flags, truncated = encode(backbone, tokenizer, text, max_length)
        cut += truncated
        out = backbone.inspect(inputs)
        maps.append([to_numpy(p)[0].astype("float32") for p in out["attention_probs"]])
        tokens.append(toks)
        special.append(flags)
        if progress is not None:
            progress(i + 1)
    if cut:
        warn(
            f"{cut} of {len(texts)} texts were longer than "
            + (f"max_length={max_length} tokens" if max_length else
               f"{positions} tokens (the model's positions)")
            + " and were truncated.")
    return AttentionMaps(tokens, maps, special, family_name(backbone))


def _is_punctuation(token):
    for marker in _MARKERS:
        token = token.replace(marker, "")
    return bool(token) and all(c in _PUNCTUATION for c in token)


STATISTICS = ("entropy", "to_cls", "to_sep", "to_punctuation", "to_previous", "to_next",
              "to_self")


def attention_statistics(maps):
    """Clark et al. 2019's per-head summaries, averaged over every query token of every text.

    Returns `{name: (L, N) float array}` (NaN where a pruned layer has fewer heads):
    - `entropy`: mean entropy (nats) of a query's attention distribution;
    - `to_cls`, `to_sep`, `to_punctuation`: mean attention mass on [CLS] / [SEP] (the family's
      special tokens) / punctuation-only tokens;
    - `to_previous`, `to_next`, `to_self`: mean attention to the token before / after / itself
      (over the queries that have one).
    """
    if not isinstance(maps, AttentionMaps) or not len(maps):
        raise ValueError("attention_statistics takes the AttentionMaps of attention_maps(...).")
    num_layers = maps.num_layers
    width = max(m.shape[0] for m in maps.maps[0]) if num_layers else 0
    sums = {k: np.zeros((num_layers, width)) for k in STATISTICS}
    counts = {k: 0 for k in STATISTICS}
    for toks, layers, flags in zip(maps.tokens, maps.maps, maps.special):
        t = len(toks)
        punct = np.array([_is_punctuation(tok) for tok in toks])
        for layer, probs in enumerate(layers):  # (N, T, T)
            n = probs.shape[0]
            if not n:
                continue
            logp = np.log(np.clip(probs, 1e-12, 1.0))
            sums["entropy"][layer, :n] += -(probs * logp).sum(-1).sum(-1)
            sums["to_cls"][layer, :n] += probs[:, :, flags["cls"]].sum((1, 2))
            sums["to_sep"][layer, :n] += probs[:, :, flags["sep"]].sum((1, 2))
            sums["to_punctuation"][layer, :n] += probs[:, :, punct].sum((1, 2))
            idx = np.arange(t)
            sums["to_self"][layer, :n] += probs[:, idx, idx].sum(-1)
            if t > 1:
                sums["to_previous"][layer, :n] += probs[:, idx[1:], idx[:-1]].sum(-1)
                sums["to_next"][layer, :n] += probs[:, idx[:-1], idx[1:]].sum(-1)
        for k in ("entropy", "to_cls", "to_sep", "to_punctuation", "to_self"):
            counts[k] += t
        counts["to_previous"] += t - 1
        counts["to_next"] += t - 1
    valid = np.zeros((num_layers, width), bool)
    for layer, probs in enumerate(maps.maps[0]):
        valid[layer, :probs.shape[0]] = True
    return {k: np.where(valid, sums[k] / max(counts[k], 1), np.nan) for k in STATISTICS}
