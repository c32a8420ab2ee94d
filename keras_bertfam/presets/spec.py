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
        tokenizer_class: the tokenizer class `make_tokenizer` builds. A preset saved with a
            tokenizer of another family's class (an XLNet backbone with a WordPiece vocabulary)
            is rebuilt by that family's `make_tokenizer` (the manifest names the class).
        tokenizer_files: the files a tokenizer needs in an assets directory (e.g. ["vocab.txt"]).
        hf_model_types: HF `config.json` "model_type" values this family converts.
        config_from_hf: HF config dict -> backbone constructor kwargs.
        weights_from_hf: `(backbone) -> [(variable, hf_key, transform)]`.
        hf_prefixes: prefixes HF task checkpoints put before the backbone names ("bert.").
        tokenizer_from_hf: `(model_dir) -> tokenizer` for an HF-format directory.
        config_to_hf: `(backbone) -> HF config dict`: with `weights_from_hf` read in reverse,
            `export_to_transformers` writes the family's HF checkpoints.
        tokenizer_to_hf: `(tokenizer, model_dir)`: writes the tokenizer's files under HF's names
            with a `tokenizer_config.json` naming HF's tokenizer class.
        hf_task_heads: `{task class name: (task) -> [(variable, hf_key, transform)]}`: the HF head
            weights `convert_task` loads (and `export_to_transformers` writes), e.g. BERT's MLM
            (`cls.predictions`) and NSP (`cls.seq_relationship`).
        hf_task_architectures: `{task class name: HF architecture}`: what `convert_task` expects
            and `export_to_transformers` writes, e.g. `{"BertPretrainer": "BertForPreTraining"}`.
        hf_other_architectures: `{task class name: {HF architecture: why}}`: HF architectures of
            the family for the same task that are another model than ours (XLNet's beam-search
            `XLNetForQuestionAnswering` against `XLNetForQuestionAnsweringSimple`): `convert_task`
            refuses such a checkpoint naming it and `why`; `from_preset` warns and starts a new
            head.
        hf_task_companions: `{task class name: {argument: (HF architecture, heads, shared)}}`:
            heads of a task that live in a second HF checkpoint, given to `convert_task` as that
            argument (ELECTRA's generator head, in the `ElectraForMaskedLM` checkpoint passed as
            `generator_preset`). `heads` and `shared` are `(task) -> [(variable, hf_key,
            transform)]`: `shared` lists weights the task shares between both models, which the
            second checkpoint should hold equal (ELECTRA's embeddings); a difference warns.
        count_params: `(config) -> int` where the backbone is not an EncoderBackbone.
        hf_unused: key prefixes of the HF base model that have no counterpart here (declared
            unused; every other tensor of a checkpoint must be used).
        hf_tied_heads: `{HF head key: the key of the tensor HF ties it to}` (keys without the
            base model's prefix): the MLM decoder weight tied to the word embeddings, a decoder
            bias to the head's `bias`. No head mapping reads them (ours computes with the tie);
            `.bin` checkpoints save them, and one saved untied (`tie_word_embeddings=false`)
            is refused where its head is loaded: ours would predict otherwise. Every other head
            tensor must be read by the task's heads or belong to another task's (`convert_task`).
        hf_head_config: `{HF head key prefix: {config key: value}}`: the HF config settings the
            heads under that prefix assume (ELECTRA's and XLNet's `sequence_summary`: its
            `summary_type`, `summary_use_proj`, `summary_activation`); a checkpoint whose config
            sets another is refused (`convert_task`) or its head left new (`from_preset`).
        hf_unexported_layers: `{task class name: (attribute names of its layers)}`: layers of a
            task with HF heads that no HF class has (SpanBertPretrainer's `sbo_head`, beside its
            MLM head): `export_to_transformers` writes the task without them, with a warning
            (any other weight no map writes is an error); `from_preset` warns they are new.
    """

    name: str
    backbone_cls: type
    make_tokenizer: Optional[Callable] = None
    tokenizer_class: Optional[type] = None
    tokenizer_files: tuple = ()
    hf_model_types: tuple = ()
    config_from_hf: Optional[Callable] = None
    weights_from_hf: Optional[Callable] = None
    hf_prefixes: tuple = ()
    tokenizer_from_hf: Optional[Callable] = None
    config_to_hf: Optional[Callable] = None
    tokenizer_to_hf: Optional[Callable] = None
    hf_task_heads: Optional[dict] = None
    hf_task_architectures: Optional[dict] = None
    hf_task_companions: Optional[dict] = None
    hf_other_architectures: Optional[dict] = None
    count_params: Optional[Callable] = None
    hf_unused: tuple = ()
    hf_tied_heads: dict = None
    # backbone -> HF keys this configuration reads from layer 0 only (XLNet's untie_r=False)
    hf_unused_of: Optional[Callable] = None
    hf_head_config: Optional[dict] = None
    hf_unexported_layers: Optional[dict] = None


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

    @property
    def size(self):
        """"L{layers} H{hidden} A{heads}" (+ "E{embedding}" when factorized)."""
        c = self.config
        size = f"L{c.get('num_layers', '?')} H{c.get('hidden_dim', '?')} A{c.get('num_heads', '?')}"
        if c.get("embedding_dim") and c.get("embedding_dim") != c.get("hidden_dim"):
            size += f" E{c['embedding_dim']}"
        return size
