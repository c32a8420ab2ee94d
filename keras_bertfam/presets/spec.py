"""What a family contributes to the one preset mechanism: a `FamilySpec` and its named presets."""
import dataclasses
from typing import Callable, Optional


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """Everything the preset mechanism needs to know about one family.

    Attributes:
        name: "bert", "roberta", ...
        backbone_cls: the family's Backbone class.
        make_tokenizer: `(spec: dict, assets_dir: str | None) -> tokenizer`; `spec` is the preset's
            tokenizer entry (kind, options), `assets_dir` a directory holding its files.
        tokenizer_files: the files a tokenizer needs in an assets directory (e.g. ["vocab.txt"]).
        hf_model_types: HF `config.json` "model_type" values this family converts.
        config_from_hf: HF config dict -> backbone constructor kwargs.
        weights_from_hf: `(backbone) -> [(variable, hf_key, transform)]`.
        hf_prefixes: prefixes HF task checkpoints put before the backbone names ("bert.").
        tokenizer_from_hf: `(model_dir) -> tokenizer` for an HF-format directory.
    """

    name: str
    backbone_cls: type
    make_tokenizer: Optional[Callable] = None
    tokenizer_files: tuple = ()
    hf_model_types: tuple = ()
    config_from_hf: Optional[Callable] = None
    weights_from_hf: Optional[Callable] = None
    hf_prefixes: tuple = ()
    tokenizer_from_hf: Optional[Callable] = None


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named preset: a backbone config, a tokenizer spec, and where the public weights live.

    `params` is the parameter count the config builds (tested); `hf_id` the public checkpoint
    whose weights the name resolves to through the local HF cache.
    """

    name: str
    family: str
    config: dict
    tokenizer: dict
    params: int
    hf_id: Optional[str] = None
    description: str = ""
