"""The registered families and preset names (one module per family in `families/`)."""
import difflib

from keras_bertfam.presets.families import load_all

FAMILIES, PRESETS = load_all()


def get(name):
    """The registered `Preset` of that name; an unknown name lists the closest ones."""
    if name in PRESETS:
        return PRESETS[name]
    close = difflib.get_close_matches(name, PRESETS, n=5, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ValueError(
        f"Unknown preset {name!r}.{hint} kb.presets.list() shows all {len(PRESETS)} presets; a "
        "path to a preset or HF-format directory works too."
    )


def family_of_class(cls):
    """The FamilySpec whose backbone class is `cls`, or None."""
    for spec in FAMILIES.values():
        if cls is spec.backbone_cls:
            return spec
    return None


def family_of_tokenizer(name):
    """The FamilySpec whose `make_tokenizer` builds the tokenizer class named `name` (the first
    registered of those sharing one: BERT's for WordPiece, RoBERTa's for byte-level BPE), or
    None."""
    for spec in FAMILIES.values():
        if spec.tokenizer_class is not None and spec.tokenizer_class.__name__ == name:
            return spec
    return None


def check_family(spec, cls, preset):
    """`cls` (a backbone or task class with a `family`) must load `spec`'s presets."""
    family = getattr(cls, "family", None) if cls is not None else None
    if family is None:
        return
    if family != spec.name:
        raise ValueError(
            f"{preset!r} is a {spec.name!r} preset; {cls.__name__} loads {family!r} presets. "
            f"Use {spec.backbone_cls.__name__}.from_preset, or kb.presets.load_backbone."
        )
