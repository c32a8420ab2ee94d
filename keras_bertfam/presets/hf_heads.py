"""HF task heads: `convert_task` (strict) and `load_hf_heads` (what `Task.from_preset` loads when
the HF checkpoint has the heads), from the families' `hf_task_heads`."""
import warnings

import numpy as np

from keras_bertfam.models.backbone import Backbone
from keras_bertfam.presets import checkpoints
from keras_bertfam.presets.checkpoints import FINETUNING_TASKS, known_head_keys
from keras_bertfam.presets.deferred import deferring
from keras_bertfam.presets.loaders import HFDirLoader, get_loader, hf_family
from keras_bertfam.presets.loaders import warn_if_no_pooler
from keras_bertfam.presets.registry import FAMILIES, family_of_class
from keras_bertfam.user_warnings import warn


def load_hf_heads(task, preset, download=False, warn_no_pooler=False, **companions):
    """Loads the task's HF heads (the family's `hf_task_heads`) from `preset` (an HF-format
    directory or a registered name), each head layer the checkpoint has whole, e.g.
    `MaskedLM.from_preset("roberta_base_en")` gets `RobertaForMaskedLM`'s `lm_head` and
    `BertPretrainer` a `BertForMaskedLM`'s MLM head (its NSP head new, with a warning); other
    presets and checkpoints without them leave the task's heads as they are. `companions`: the
    presets of the family's `hf_task_companions` (ELECTRA's `generator_preset`). A head of
    another shape (a classifier with another number of labels) stays new, with a warning.
    `warn_no_pooler`: warn when `preset` has no pooler weights, the task reads the pooler
    (`uses_pooled_output`) and its heads do not fill it either (see `convert_hf`). Head tensors
    no head of the family knows warn. `task.from_preset` calls this; `convert_task` is the
    strict form."""
    spec = family_of_class(type(task.backbone))
    if spec is None:
        return
    name = type(task).__name__
    sources = [(preset, (spec.hf_task_heads or {}).get(name),
                (spec.hf_task_architectures or {}).get(name))]
    for argument, (architecture, companion_heads, _) in (
            spec.hf_task_companions or {}).get(name, {}).items():
        if companions.get(argument) is not None:
            sources.append((companions[argument], companion_heads, architecture))
    loaders = [get_loader(source, download) for source, _, _ in sources]  # resolved once each
    for i, (source, source_heads, architecture) in enumerate(sources):
        # only a task that reads the pooler (not MaskedLM: BertForMaskedLM saves none)
        check_pooler = warn_no_pooler and i == 0 and type(task).uses_pooled_output
        model_dir = None
        if source_heads is not None or check_pooler or name in FINETUNING_TASKS:
            model_dir = loaders[i].hf_model_dir(download)
        if model_dir is None:
            continue
        cfg = checkpoints.read_hf_config(model_dir)
        other = _another_finetuning_head(spec, name, cfg)
        if other is not None:
            warn(f"{model_dir!r} is a {other[0]} checkpoint, {other[1]}'s head: {name} "
                 f"does not load it as its own; its head is new"
                 + (f" (it loads one from {architecture})" if architecture else "")
                 + ".")
            source_heads = None
        unlike = _another_model(spec, name, cfg)
        if unlike is not None:
            warn(f"{model_dir!r} is a {unlike[0]} checkpoint, {unlike[1]}: {name} does "
                 f"not load its head; its head is new (it loads one from "
                 f"{architecture}). The backbone's weights are loaded.")
            source_heads = None
        if source_heads is None and not check_pooler:
            continue
        raw = checkpoints.load_state_dict(model_dir)
        state = checkpoints.strip_prefix(raw, spec.hf_prefixes)
        loaded = _load_heads(task, source_heads, state, model_dir, architecture, spec, cfg)
        if unlike is None:  # else its head's tensors are named in the warning above
            _check_heads_used(loaded, raw, spec, checkpoints.weights_file(model_dir),
                             f"{name} loads its heads from {architecture or 'no HF checkpoint'}",
                             strict=False)
        if check_pooler:
            warn_if_no_pooler(model_dir, task.backbone, spec.weights_from_hf(task.backbone),
                              state, loaded)
    if isinstance(loaders[0], HFDirLoader):  # a directory, hub id or registered name alike
        _warn_heads_no_checkpoint_fills(task, spec, loaders[0], download, companions)


def _load_heads(task, heads, state, model_dir, architecture, spec, cfg):
    """`heads(task)` loaded from `state`, each head layer whose tensors `state` has all (a layer
    loads whole or not at all: `_whole_layers`) -> the mapping loaded, or []. So a
    `BertForMaskedLM` directory gives `BertPretrainer` its MLM head (HF's `BertForPreTraining`
    loads it too). The layers left out warn that they are new (a bare `BertModel` directory
    into TextClassifier; the NSP head of a `BertPretrainer` from a `BertForMaskedLM`), naming
    the tensors and the layers, whichever way the checkpoint was named: a directory, an HF hub
    id's cached snapshot or a registered name's (session 46 kept registered names silent: the
    same checkpoint warned from its directory, not by its name)."""
    mapping = []
    try:
        mapping = heads(task) if heads is not None else []
        loading = _whole_layers(task, mapping, state)
        if len(loading) < len(mapping):
            _warn_new_head(task, mapping, loading, state, model_dir, architecture)
        if not loading:
            return []
        check_tied_heads(loading, state, spec, checkpoints.weights_file(model_dir))
        _check_head_config(loading, spec, cfg, checkpoints.weights_file(model_dir))
        checkpoints.assign(loading, state, what=f"{type(task).__name__} head",
                           source=checkpoints.weights_file(model_dir))
        return loading
    except checkpoints.CheckpointError as e:
        if isinstance(e, TiedHeadError):  # no new head either: the task would predict otherwise
            raise
        # A head of another shape; or, with no mapping, one HF's cannot fill (TextClassifier's
        # hidden_activation), news only from a checkpoint of that head.
        if mapping or architecture in (cfg.get("architectures") or ()):
            warn(f"The checkpoint's head was not loaded, the task's is new: {e}")
        return []


def _whole_layers(task, mapping, state):
    """The entries of the head `mapping` whose layer `state` has every tensor of: a head layer
    (the task's top-level layer holding the variable: BertPretrainer's `mlm_head` and `nsp_head`)
    loads whole or not at all. A mapping that fills a backbone layer (RoBERTa's
    `classifier.dense`, our pooler, one HF module with `classifier.out_proj`) is one layer."""
    ours = {id(w) for w in task.backbone.weights}
    layer_of = {}
    if not any(id(v) in ours for v, _, _ in mapping):
        for i, layer in enumerate(task.layers):
            for w in layer.weights:
                layer_of.setdefault(id(w), i)
    lacking = {layer_of.get(id(v)) for v, key, _ in mapping if key not in state}
    return [m for m in mapping if layer_of.get(id(m[0])) not in lacking]


_NEW_HEAD_WARNING = r".* has no weights for \w+'s head "


def _warn_new_head(task, mapping, loading, state, model_dir, architecture):
    """HF's "Some weights ... are newly initialized": the head layers of `mapping` left out of
    `loading` keep their random initialization: the tensors `model_dir` lacks are named, with
    those of the same layers it has (not loaded without them), and every such layer (not the
    backbone's: its pooler, which RoBERTa's classifier fills, loads from the checkpoint when it
    has one)."""
    ours = {id(w) for w in task.backbone.weights}
    loaded = {id(v) for v, _, _ in loading}
    new = [m for m in mapping if id(m[0]) not in loaded]
    missing = sorted(key for _, key, _ in new if key not in state)
    unread = sorted(key for _, key, _ in new if key in state)
    layers = sorted({v.path.rsplit("/", 1)[0] for v, _, _ in new if id(v) not in ours})
    lacking = f"{architecture}'s {missing}" + (
        f"; its {unread}, of the same layers, are not loaded without them" if unread else "")
    _warn_random_layers(task, model_dir, lacking, layers,
                        f"load {_a(architecture)} directory to get the head")


def _warn_random_layers(task, model_dir, lacking, layers, remedy, part="head"):
    """The new-head warning: `model_dir` lacks `lacking`, the task's `part`, so its `layers`
    keep their random initialization; `remedy`: how to get them. It points at the user's line
    (from_preset's, however deep the load)."""
    name = type(task).__name__
    warn(f"{model_dir!r} has no weights for {name}'s {part} ({lacking}): its layers "
         f"{layers} keep their random initialization. Train {name} (fit) before "
         f"predicting with it, or {remedy}.")


def _a(architecture):
    return ("an " if architecture[0] in "AEIOU" else "a ") + architecture


def _warn_heads_no_checkpoint_fills(task, spec, loader, download, companions):
    """The heads of an HF-format preset (its `loader`) that no HF checkpoint of the family
    fills warn as a missing head does: SpanBERT's span-boundary head (no HF class has it; its
    MLM head is BertForMaskedLM's), and an ElectraPretrainer's generator without
    `generator_preset` (its HF class, `ElectraForMaskedLM`, another checkpoint). The heads
    `load_hf_heads` loads, and the backbone's weights, are not named."""
    name = type(task).__name__
    model_dir = loader.hf_model_dir(download)
    own = (spec.hf_task_heads or {}).get(name)
    given = (spec.hf_task_companions or {}).get(name, {})
    if not given:
        try:
            layers = _layers_outside(task, own(task) if own is not None else [])
        except checkpoints.CheckpointError:  # a head HF's cannot fill: _load_heads said so
            return
        if layers:
            _warn_random_layers(task, model_dir, f"no HF {spec.name} class has them", layers,
                                f"load {_a(name)} preset saved with save_to_preset to get them",
                                part="heads")
        return
    for argument, (architecture, heads, _) in given.items():
        if companions.get(argument) is None:
            layers = _layers_outside(task, own(task))
            _warn_random_layers(
                task, model_dir, f"{architecture}'s, from {argument}=, not given", layers,
                f"pass {argument}= {_a(architecture)} directory to get them",
                part=argument.replace("_preset", ""))  # convert_task's filter lets it through


def _layers_outside(task, mapping):
    """The top-level layers of `task` with weights neither in its backbone nor in `mapping`: a
    backbone (ELECTRA's generator) named by the task's attribute for it."""
    known = {id(w) for w in task.backbone.weights} | {id(v) for v, _, _ in mapping}
    attributes = {id(v): k for k, v in vars(task).items() if not k.startswith("_")}
    return [attributes.get(id(layer), layer.name) if isinstance(layer, Backbone) else layer.name
            for layer in task.layers
            if layer is not task.backbone and any(id(w) not in known for w in layer.weights)]


@deferring
def convert_task(path, task_cls, load_weights=True, preprocessor="default", **kwargs):
    """An HF-format task checkpoint -> our `task_cls` with the backbone's *and* the head's weights.

    The heads come from the family's `hf_task_heads`, e.g. BERT's `BertForPreTraining` (MLM
    `cls.predictions.*` + NSP) into `BertPretrainer`, ALBERT's `AlbertForPreTraining` (MLM + SOP)
    into `AlbertPretrainer`, `{Bert,Roberta,Albert,DistilBert,Electra}ForMaskedLM` into
    `MaskedLM`, BERT's `cls.predictions` into `SpanBertPretrainer`'s MLM head (no HF class has
    its span-boundary head: it stays new, with a warning), `ElectraForPreTraining`'s
    discriminator head into `ElectraPretrainer` (with
    `generator_preset=` an `ElectraForMaskedLM` directory, its generator head too: the family's
    `hf_task_companions`), `XLNetLMHeadModel`'s `lm_loss` into `XLNetPretrainer`,
    `{Bert,Albert,Roberta,DistilBert,Electra,XLNet}ForSequenceClassification` into
    `TextClassifier` (RoBERTa's `classifier.dense` into the backbone's tanh pooler; DistilBERT's
    `pre_classifier`, ELECTRA's `classifier.dense` and XLNet's `sequence_summary.summary` into
    the hidden layer TextClassifier has by default for those families), and every BERT-layout
    family's (and Longformer's and XLNet's) `*ForTokenClassification` into
    `TokenClassifier`, `*ForQuestionAnswering` into `QuestionAnswerer`, and every family's
    `*ForMultipleChoice` into `MultipleChoice` (its head HF's: DistilBERT's `pre_classifier`,
    ELECTRA's and XLNet's `sequence_summary` into its hidden layer); XLNet's QuestionAnswerer is
    HF's `XLNetForQuestionAnsweringSimple` (`qa_outputs`), and its beam-search
    `XLNetForQuestionAnswering` (another model: the family's `hf_other_architectures`) is refused
    naming it.
    A checkpoint without the head's weights, or of another family than the task's heads, is an
    error naming what was expected. Every tensor outside the checkpoint's base model must fill the
    task's heads, be tied to another tensor (`hf_tied_heads`) or be another task's head of the family,
    dropped with a warning (`BertForPreTraining`'s NSP head converted into `MaskedLM`): any other
    is an error. So is a checkpoint whose config names another fine-tuning task's architecture
    (a `BertForSequenceClassification` into `TokenClassifier`: the same `classifier` tensors);
    `from_preset` warns and starts a new head for it.
    """
    loader = get_loader(path)
    if type(loader) is not HFDirLoader:
        raise ValueError(f"convert_task takes an HF-format model directory, got {path!r} "
                         f"({loader.kind}).")
    where = loader.where
    spec, cfg = hf_family(where)
    name = task_cls.__name__
    heads = (spec.hf_task_heads or {}).get(name)
    if heads is None:
        raise ValueError(_no_heads_message(where, spec, cfg, name))
    unlike = _another_model(spec, name, cfg)
    if unlike is not None:
        raise checkpoints.CheckpointError(
            f"{where!r} is a {unlike[0]} checkpoint, {unlike[1]}; {name} loads its heads from "
            f"{(spec.hf_task_architectures or {}).get(name)}, and {unlike[0]}'s do not convert "
            f"into it. Start {name} from its backbone with {name}.from_preset (a new head).")
    other = _another_finetuning_head(spec, name, cfg)
    if other is not None:
        raise checkpoints.CheckpointError(
            f"{where!r} is a {other[0]} checkpoint, {other[1]}'s head; {name} loads its heads from "
            f"{(spec.hf_task_architectures or {}).get(name)}. Tensors of the same names would load "
            f"as another task's head: convert it with {other[1]}, or start {name} from it with "
            f"{name}.from_preset (a new head).")
    if name in ("TextClassifier", "TokenClassifier") and "num_classes" not in kwargs:
        kwargs["num_classes"] = cfg.get("num_labels") or len(cfg.get("id2label", {})) or 2
    companions = (spec.hf_task_companions or {}).get(name, {})
    with warnings.catch_warnings():  # a missing head is the error below, not a warning
        warnings.filterwarnings("ignore", message=_NEW_HEAD_WARNING)
        task = task_cls.from_preset(where, load_weights=load_weights, preprocessor=preprocessor,
                                    **kwargs)
    if load_weights:
        expected = (spec.hf_task_architectures or {}).get(name, "a head checkpoint")
        _assign_heads(heads(task), where, spec, name, f"{name} loads its heads from {expected}")
        for argument, (expected, companion_heads, shared) in companions.items():
            if kwargs.get(argument) is not None:
                other = get_loader(kwargs[argument])
                if type(other) is HFDirLoader:
                    _assign_heads(companion_heads(task), other.where, spec, name,
                                  f"{name} loads its {argument} heads from {expected}")
                    _warn_if_not_shared(shared(task), other.where, spec, name, argument)
    return task


def _another_finetuning_head(spec, name, cfg):
    """(architecture, task) when the HF config `cfg` names another fine-tuning task's head
    architecture of the family and not `name`'s, else None."""
    if name not in FINETUNING_TASKS:
        return None
    architectures = spec.hf_task_architectures or {}
    named = cfg.get("architectures") or ()
    if architectures.get(name) in named:
        return None
    for task, architecture in architectures.items():
        if task in FINETUNING_TASKS and task != name and architecture in named:
            return architecture, task
    return None


def _another_model(spec, name, cfg):
    """(architecture, why) when the HF config `cfg` names an architecture of the family for the
    task `name` that is another model than ours (`spec.hf_other_architectures`), else None."""
    named = cfg.get("architectures") or ()
    for architecture, why in ((spec.hf_other_architectures or {}).get(name) or {}).items():
        if architecture in named and (spec.hf_task_architectures or {}).get(name) not in named:
            return architecture, why
    return None


def _no_heads_message(where, spec, cfg, name):
    owners = [s for s in FAMILIES.values() if name in (s.hf_task_heads or {})]
    held = f"{where!r} holds an HF {cfg.get('model_type')!r} checkpoint " \
           f"({', '.join(cfg.get('architectures') or ['no architectures'])})"
    if owners and spec not in owners:
        wanted = ", ".join(f"{s.name!r} ({(s.hf_task_architectures or {}).get(name, '?')})"
                           for s in owners)
        return (f"{name}'s HF heads come from checkpoints of the {wanted} family; {held}. "
                f"Convert it with a task of its family: {sorted(spec.hf_task_heads or {})}.")
    return (f"No HF head conversion for {name} in the {spec.name!r} family (it has: "
            f"{sorted(spec.hf_task_heads or {})}); {held}.")


def _warn_if_not_shared(mapping, where, spec, name, argument):
    """The task's shared weights (from its first checkpoint) against the second checkpoint's."""
    import keras

    state = checkpoints.strip_prefix(checkpoints.load_state_dict(where), spec.hf_prefixes)
    for variable, key, transform in mapping:
        if key not in state:
            continue
        theirs = (transform or (lambda v: v))(np.asarray(state[key], "float32"))
        ours = keras.ops.convert_to_numpy(variable)
        if theirs.shape != ours.shape or not np.allclose(theirs, ours, atol=1e-6):
            warn(f"{name} shares {key} between its models, but the {argument} "
                 f"checkpoint {where!r} holds another {key}: the task uses the first "
                 "checkpoint's, so its second model is not exactly the checkpoint's.")
            return


def _check_head_config(mapping, spec, cfg, source):
    """The HF config settings the family's heads assume (`spec.hf_head_config`, per head key
    prefix: ELECTRA's and XLNet's `sequence_summary`), for the heads of `mapping`: a checkpoint
    whose config.json sets another (an XLNet summary over the mean, no projection) is a
    `CheckpointError` naming them; its tensors would load into a head that computes otherwise."""
    for prefix, assumed in (spec.hf_head_config or {}).items():
        if not any(key.startswith(prefix) for _, key, _ in mapping):
            continue
        other = {k: cfg[k] for k, v in assumed.items() if k in cfg and cfg[k] != v}
        if other:
            raise checkpoints.CheckpointError(
                f"{source!r}: its config.json sets {other} for its {prefix.rstrip('.')} head; "
                f"the {spec.name} heads here compute HF's with {assumed} and nothing else.")


class TiedHeadError(checkpoints.CheckpointError):
    """An HF checkpoint's head is untied where ours is tied (see `check_tied_heads`)."""


def check_tied_heads(mapping, state, spec, source):
    """A head tensor HF ties to another (the MLM decoder to the word embeddings: the family's
    `hf_tied_heads`) must hold that tensor's values where `mapping` loads its head: ours computes
    with the tie, so a checkpoint saved untied (`tie_word_embeddings=false`) would predict
    otherwise (it loaded, its decoder silently replaced by the embeddings)."""
    heads = {key.split(".")[0] for _, key, _ in mapping}
    for key, tied_to in (spec.hf_tied_heads or {}).items():
        if key.split(".")[0] not in heads or key not in state or tied_to not in state:
            continue
        value, tied = np.asarray(state[key]), np.asarray(state[tied_to])
        if value.shape != tied.shape or not np.array_equal(value, tied):
            raise TiedHeadError(
                f"{source!r}: its {key} differs from {tied_to}, which the {spec.name} head here "
                f"ties it to (an untied checkpoint: config.json's tie_word_embeddings=false?). "
                f"Loaded, this head would not give the checkpoint's predictions: not loaded.")


def _assign_heads(mapping, where, spec, name, expected):
    cfg = checkpoints.read_hf_config(where)
    hint = (f"{where!r} is a {', '.join(cfg.get('architectures') or ['headless'])} checkpoint; "
            f"{expected}.")
    raw = checkpoints.load_state_dict(where)
    source = checkpoints.weights_file(where)
    _check_head_config(mapping, spec, cfg, source)
    state = checkpoints.strip_prefix(raw, spec.hf_prefixes)
    check_tied_heads(mapping, state, spec, source)
    checkpoints.assign(mapping, state, what=f"{name} head", hint=hint, source=source)
    _check_heads_used(mapping, raw, spec, source, expected)


def _check_heads_used(mapping, raw, spec, source, expected, strict=True):
    """Every tensor of the checkpoint `raw` outside its base model fills `mapping` (the task's
    heads), is declared unused or is another task's head of the family: dropped, with a warning
    when `strict` (HF's "Some weights of the model checkpoint were not used"). Any other (a head
    with more layers than HF's) is an error, a warning when not `strict`."""
    used = {key for _, key, _ in mapping}
    left = sorted(k for k in checkpoints.head_keys(raw, spec.hf_prefixes)
                  if k not in used and not k.endswith(checkpoints.HF_BUFFERS))
    if not left:
        return
    known = known_head_keys(spec)
    unknown = [k for k in left if k not in known]
    if unknown:
        message = (f"{source!r} holds {len(unknown)} tensor(s) outside the base model that no "
                   f"{spec.name} head has a place for, e.g. {unknown[:4]}; {expected}"
                   + (f": {sorted(used)}" if used else ""))
        if strict:
            raise checkpoints.CheckpointError(message + ". A head with more or other layers "
                                              "than HF's does not convert.")
        warn(message + "; they are not loaded.")
    dropped = [k for k in left if k in known and k not in (spec.hf_tied_heads or ())]
    if strict and dropped:
        warn(f"Some weights of {source!r} were not used: {dropped}, another task's head "
             f"of the {spec.name} family ({expected}).")


