"""Export to HF transformers: a backbone or task as an HF-format directory (`config.json`,
`model.safetensors`, the tokenizer's files), the families' HF weight maps read in reverse."""
import os

from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.registry import family_of_class


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
    """
    backbone = getattr(model, "backbone", model)
    spec = family_of_class(type(backbone))
    if spec is None or spec.config_to_hf is None:
        raise NotImplementedError(
            f"export_to_transformers does not know {type(backbone).__name__}'s HF format "
            "(its family gives no config_to_hf).")
    task_name = type(model).__name__
    heads = (spec.hf_task_heads or {}).get(task_name) if model is not backbone else None
    if tokenizer is None:
        tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    if generator_path is not None:
        generator = getattr(model, "generator", None)
        if task_name != "ElectraPretrainer" or generator is None:
            raise ValueError(f"generator_path is for an ElectraPretrainer's generator; got a "
                             f"{task_name}.")
        _write_transformers(generator_path, generator, spec, "MaskedLM",
                            spec.hf_task_heads["MaskedLM"](model), None, tokenizer)
    # HF's classes of the tasks that do not use the pooled output (*ForMaskedLM,
    # *ForTokenClassification, *ForQuestionAnswering) have no pooler: it is not written for them.
    pooler = not heads or getattr(model, "uses_pooled_output", True)
    return _write_transformers(path, backbone, spec, task_name if heads else None,
                               heads(model) if heads else [], getattr(model, "num_classes", None),
                               tokenizer, pooler=pooler)


def _write_transformers(path, backbone, spec, task_name, head_mapping, num_classes, tokenizer,
                        pooler=True):
    """One HF directory: `backbone` (with `head_mapping` for the HF class of `task_name`;
    without its pooler when not `pooler`)."""
    import json

    from safetensors.numpy import save_file

    config = spec.config_to_hf(backbone)
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
    # Backbone weights a head maps are written under the head's names only (our RoBERTa pooler is
    # RobertaForSequenceClassification's classifier.dense; its RobertaModel has no pooler).
    in_heads = {id(variable) for variable, _, _ in head_mapping}
    mapping = [m for m in spec.weights_from_hf(backbone) if id(m[0]) not in in_heads
               and (pooler or not m[1].startswith("pooler."))]
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
