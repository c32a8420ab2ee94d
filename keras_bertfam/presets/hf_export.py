"""Export to HF transformers: a backbone or task as an HF-format directory (`config.json`,
`model.safetensors`, the tokenizer's files), the families' HF weight maps read in reverse."""
import os

from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.registry import family_of_class, family_of_tokenizer
from keras_bertfam.user_warnings import warn


def export_to_transformers(model, path, tokenizer=None, generator_path=None):
    """Writes a backbone or task as an HF-format directory that `transformers` loads.

    `config.json` (the family's `config_to_hf`, with the task's HF architecture), the weights as
    `model.safetensors` (the family's HF weight maps read in reverse, so a family plugs in by
    giving `config_to_hf`), and the tokenizer's files (the family's `tokenizer_to_hf`) for the
    task's preprocessor's tokenizer or `tokenizer`. Tasks with HF heads (`hf_task_heads`) get
    them under HF's names; other tasks export their backbone. Every family exports (XLNet with
    `untie_r=True`, as its public checkpoints). `ElectraPretrainer` writes its discriminator with
    its head (`ElectraForPreTraining`) to `path` and, given `generator_path`, its generator with
    its MLM head (`ElectraForMaskedLM`, the embeddings the two share in both) there: the pair
    `ElectraPretrainer.from_preset(path, generator_preset=generator_path)` loads back.
    Every weight of `model` is written or declared not exported: the pooler where the task's HF
    class has none, and, with a warning, the head of a task without HF heads, a task's layers
    no HF class has (SpanBertPretrainer's span-boundary head: it is written as
    `BertForMaskedLM`) and an ElectraPretrainer's generator without `generator_path`. Any other
    is an error (nothing is written).
    """
    backbone = getattr(model, "backbone", model)
    spec = family_of_class(type(backbone))
    if spec is None or spec.config_to_hf is None:
        raise NotImplementedError(
            f"export_to_transformers does not know {type(backbone).__name__}'s HF format "
            "(its family gives no config_to_hf).")
    for part in (backbone, getattr(model, "generator", None)):
        _refuse_pruned(part)
    config = spec.config_to_hf(backbone)
    task_name = type(model).__name__
    heads = (spec.hf_task_heads or {}).get(task_name) if model is not backbone else None
    if tokenizer is None:
        tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    # the tokenizer's family class: its own or its nearest base that is one (XLNet's: its own)
    kind = next((c for c in type(tokenizer).__mro__ if family_of_tokenizer(c.__name__)), None)
    if tokenizer is not None and spec.tokenizer_class is not None and kind is not None and (
            kind is not spec.tokenizer_class):
        # HF's tokenizer of the family (AutoTokenizer reads its class from the files) would pack
        # the family's layout around another vocabulary: not the model's inputs
        raise ValueError(
            f"export_to_transformers writes {spec.name}'s HF tokenizer files, from a "
            f"{spec.tokenizer_class.__name__}; this {type(model).__name__} has a "
            f"{type(tokenizer).__name__}, which HF's {spec.name} tokenizer cannot stand for. "
            "Export the model without it (a model with preprocessor=None, or its backbone) and "
            "keep the tokenizer with save_to_preset.")
    generator = getattr(model, "generator", None)
    if generator_path is not None and (task_name != "ElectraPretrainer" or generator is None):
        raise ValueError(f"generator_path is for an ElectraPretrainer's generator; got a "
                         f"{task_name}.")
    head_mapping = heads(model) if heads else []
    mapping = _backbone_mapping(backbone, spec, head_mapping)
    # HF's classes of the tasks that do not use the pooled output (*ForMaskedLM,
    # *ForTokenClassification, *ForQuestionAnswering) have no pooler: it is not written for them.
    pooler = not heads or getattr(model, "uses_pooled_output", True)
    written = [m for m in mapping if pooler or not m[1].startswith("pooler.")]
    no_pooler = {id(m[0]) for m in mapping} - {id(m[0]) for m in written}
    generator_heads = generator_mapping = []
    if heads and generator is not None:  # an ElectraForMaskedLM at generator_path
        generator_heads = spec.hf_task_heads["MaskedLM"](model)
        generator_mapping = _backbone_mapping(generator, spec, generator_heads)
    in_backbone = {id(w) for w in backbone.weights}
    declared, why = [], None
    if model is not backbone and not heads:
        declared = [w for w in model.weights if id(w) not in in_backbone]
        why = f"the {spec.name!r} family has no HF head for {task_name}"
    elif generator is not None:
        declared = [m[0] for m in generator_mapping + generator_heads]
        why = "its generator goes to generator_path"
    elif model is not backbone:  # layers no HF class has (SpanBERT's span-boundary head)
        names = (spec.hf_unexported_layers or {}).get(task_name, ())
        declared = [w for name in names for w in getattr(model, name).weights
                    if id(w) not in in_backbone]
        why = f"no HF class of the {spec.name!r} family has its {list(names)}"
    exported = written + head_mapping
    if generator_path is not None:
        exported, declared = exported + generator_mapping + generator_heads, []
    _check_all_written(model, spec, exported, no_pooler, declared, why)
    _warn_output_activation(model, spec, task_name if heads else None)
    if generator_path is not None:
        _write_transformers(generator_path, spec.config_to_hf(generator), spec, "MaskedLM",
                            generator_mapping, generator_heads, None, tokenizer)
    return _write_transformers(path, config, spec, task_name if heads else None, written,
                               head_mapping, getattr(model, "num_classes", None), tokenizer)


def _warn_output_activation(model, spec, task_name):
    """A task with an output `activation` (TextClassifier's, keras-hub's): HF's model class has
    none and returns the logits, which the exported weights compute; said, not silent."""
    activation = getattr(model, "activation", None) if task_name is not None else None
    if activation is None:
        return
    name = getattr(activation, "__name__", repr(activation))
    warn(
        f"{task_name}(activation={name!r}): HF's {spec.hf_task_architectures[task_name]} "
        f"returns the logits, before the activation, which is not part of the exported model "
        f"(its weights are written as they are). Apply {name} to HF's logits; from_preset(..., "
        f"activation={name!r}) loads the export back with it.")


def _refuse_pruned(backbone):
    """A backbone of `kb.analysis.prune_heads` (fewer heads in some layers): its HF config would
    declare the full head count, and transformers could not load the smaller kernels."""
    counts = getattr(backbone, "heads_per_layer", None)
    if not counts or all(int(n) == int(backbone.num_heads) for n in counts):
        return
    layers = ", ".join(f"layer {i} ({n} of {backbone.num_heads} heads)"
                       for i, n in enumerate(counts) if int(n) != int(backbone.num_heads))
    raise ValueError(
        f"export_to_transformers cannot write a model whose attention heads were pruned "
        f"(kb.analysis.prune_heads): {layers}. Its HF config would declare "
        f"{backbone.num_heads} heads per layer and transformers could not load the smaller "
        "kernels. Keep the pruned model with save_to_preset (or export it as a SavedModel).")


def _backbone_mapping(backbone, spec, head_mapping):
    """The backbone's HF weight map without the weights a head maps: those are written under the
    head's names only (our RoBERTa pooler is RobertaForSequenceClassification's classifier.dense;
    its RobertaModel has no pooler)."""
    in_heads = {id(variable) for variable, _, _ in head_mapping}
    return [m for m in spec.weights_from_hf(backbone) if id(m[0]) not in in_heads]


def _check_all_written(model, spec, written, no_pooler, declared, why):
    """Every weight of `model` is in `written`, in `no_pooler` (silently) or in `declared`, not
    exported with a warning giving `why`. Any other is an error."""
    name = type(model).__name__
    done = {id(variable) for variable, _, _ in written} | no_pooler
    left = [w for w in model.weights if id(w) not in done and "float" in str(w.dtype)]
    declared = {id(w) for w in declared}
    undeclared = [w.path for w in left if id(w) not in declared]
    if undeclared:
        raise NotImplementedError(
            f"export_to_transformers would drop {len(undeclared)} weight(s) of the {name} that no "
            f"HF weight map of the {spec.name!r} family writes, e.g. {undeclared[:4]}.")
    if left:
        warn(f"{len(left)} weight(s) of the {name} are not exported ({why}), e.g. "
             f"{[w.path for w in left[:4]]}.")


def _write_transformers(path, config, spec, task_name, mapping, head_mapping, num_classes,
                        tokenizer):
    """One HF directory: the backbone's `config` and `mapping`, with `head_mapping` for the HF
    class of `task_name`."""
    import json

    from safetensors.numpy import save_file

    prefix = ""
    if task_name is not None:
        prefix = spec.hf_prefixes[0] if spec.hf_prefixes else ""
        config["architectures"] = [spec.hf_task_architectures[task_name]]
        if num_classes:
            config["num_labels"] = num_classes
            config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_classes)}
            config["label2id"] = {f"LABEL_{i}": i for i in range(num_classes)}
            if num_classes == 1:
                config["problem_type"] = "regression"
    state = {prefix + k: v for k, v in checkpoints.export_state_dict(mapping).items()}
    state.update(checkpoints.export_state_dict(head_mapping))
    os.makedirs(path, exist_ok=True)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    tmp = os.path.join(path, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(config, f, indent=2)
    os.replace(tmp, os.path.join(path, "config.json"))
    if tokenizer is not None and spec.tokenizer_to_hf is not None:
        spec.tokenizer_to_hf(tokenizer, path)
    return path
