"""DistilBERT: backbone parity with HF, the preset, student initialization, the Distiller."""
import importlib
import keras
import numpy as np
import pytest

import keras_bertfam as kb
from keras_bertfam.tasks.distiller import Distiller, student_from_teacher
from tests.conftest import to_numpy

TEACHER = dict(vocabulary_size=60, num_layers=4, num_heads=2, hidden_dim=32, intermediate_dim=64,
               max_sequence_length=16, dropout=0.0)
# Where the depth is not the point (the losses, the fit, saving): a teacher of two layers, each
# layer built and traced (JAX: compiled) again by every model. The layers a student takes from a
# deeper teacher: test_student_from_teacher, test_loss_value_by_hand.
TEACHER2 = dict(TEACHER, num_layers=2)


def batch(b=8, t=10, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, 60, (b, t)).astype("int32")
    padding = np.ones_like(ids)
    padding[0, 7:] = 0
    ids[0, 7:] = 0
    positions = np.tile(np.array([[1, 3, 5]], "int32"), (b, 1))
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": padding,
         "mask_positions": positions}
    return x, np.take_along_axis(ids, positions, 1), np.ones(positions.shape, "float32")


def test_hf_parity(tmp_path):
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    torch.manual_seed(0)
    hf = transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
        max_position_embeddings=20)).eval()
    path = str(tmp_path / "hf")
    hf.save_pretrained(path)
    ours = kb.presets.convert(path)
    assert isinstance(ours, kb.models.DistilBertBackbone)
    assert sorted(ours.input) == ["padding_mask", "token_ids"]
    assert "pooled_output" not in ours.output
    ids = np.random.RandomState(0).randint(0, 99, (2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    out = to_numpy(ours({"token_ids": ids, "padding_mask": mask})["sequence_output"])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids),
                 attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    assert np.abs(out - ref)[mask.astype(bool)].max() <= 1e-4
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())
    # The same directory loads through the class too.
    assert kb.models.DistilBertBackbone.from_preset(path).num_params() == ours.num_params()


def test_preset_params_equal_hf():
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    ours = kb.models.DistilBertBackbone.from_preset("distil_bert_base_en_uncased",
                                                    load_weights=False)
    with torch.device("meta"):  # shapes only: no 66M weights to allocate and initialize
        hf = transformers.DistilBertModel(transformers.DistilBertConfig())
    n = sum(p.numel() for p in hf.parameters())
    assert ours.num_params() == n == kb.presets.get("distil_bert_base_en_uncased").params
    assert round(n / 1e6) == 66


def test_student_from_teacher():
    teacher = kb.models.BertBackbone(**TEACHER)
    student = student_from_teacher(teacher, layers=(3, 1))
    assert isinstance(student, kb.models.DistilBertBackbone)
    assert student.num_layers == 2 and student.embeddings.segment_embedding is None
    for i, layer in enumerate((3, 1)):
        for s, t in zip(student.encoder.layer_block(i).weights,
                        teacher.encoder.layer_block(layer).weights):
            np.testing.assert_array_equal(to_numpy(s), to_numpy(t))
    np.testing.assert_array_equal(to_numpy(student.token_embedding.embeddings),
                                  to_numpy(teacher.token_embedding.embeddings))
    # A student of the teacher's own class keeps token types (and the pooler).
    same = student_from_teacher(teacher, layers=range(4), student_cls=kb.models.BertBackbone)
    x, _, _ = batch()
    features = {k: x[k] for k in teacher.input}
    np.testing.assert_allclose(to_numpy(same(features)["pooled_output"]),
                               to_numpy(teacher(features)["pooled_output"]), atol=1e-6)
    with pytest.raises(ValueError, match="layers"):
        student_from_teacher(teacher, layers=(0, 4))


@pytest.mark.multibackend
def test_loss_is_zero_for_a_copy_of_the_teacher():
    teacher = kb.tasks.MaskedLM(kb.models.BertBackbone(**TEACHER2))
    copy = student_from_teacher(teacher.backbone, layers=range(2),
                                student_cls=kb.models.BertBackbone)
    distiller = Distiller(teacher, copy, alpha_mlm=0.0)  # the head is copied too
    x, y, w = batch()
    loss, values = distiller.losses_and_metrics(y, distiller(x), w)
    assert abs(float(to_numpy(loss))) < 1e-5
    assert float(to_numpy(values["mlm_loss"])) > 1.0  # excluded by alpha_mlm = 0, not zero
    # A student that differs gives a positive loss.
    other = Distiller(teacher, student_from_teacher(teacher.backbone, layers=(1,)),
                      alpha_mlm=0.0)
    assert float(to_numpy(other.losses_and_metrics(y, other(x), w)[0])) > 1e-3


def test_loss_value_by_hand():
    teacher = kb.tasks.MaskedLM(kb.models.BertBackbone(**TEACHER))
    distiller = Distiller(teacher, student_from_teacher(teacher.backbone, layers=(1, 2)),
                          temperature=2.0, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0)
    x, y, w = batch()
    out = {k: to_numpy(v).astype("float64") for k, v in distiller(x).items()}
    loss, values = distiller.losses_and_metrics(y, out, w)

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    tokens = x["padding_mask"].astype(bool)
    s, t = log_softmax(out["student_logits"] / 2), log_softmax(out["teacher_logits"] / 2)
    kl = (np.exp(t) * (t - s)).sum(-1)[tokens].mean() * 4
    hs, ht = out["student_hidden"][tokens], out["teacher_hidden"][tokens]
    cos = (1 - (hs * ht).sum(-1) / np.linalg.norm(hs, axis=-1) / np.linalg.norm(ht, axis=-1))
    mlm = -np.take_along_axis(log_softmax(out["mlm_logits"]), y[..., None], -1).mean()
    np.testing.assert_allclose(to_numpy(values["ce_loss"]), kl, rtol=1e-4)
    np.testing.assert_allclose(to_numpy(values["cos_loss"]), cos.mean(), rtol=1e-4)
    np.testing.assert_allclose(to_numpy(values["mlm_loss"]), mlm, rtol=1e-4)
    np.testing.assert_allclose(to_numpy(loss), 5 * kl + 2 * mlm + cos.mean(), rtol=1e-4)


@pytest.mark.multibackend
def test_loss_falls_and_teacher_stays_frozen():
    teacher = kb.tasks.MaskedLM(kb.models.BertBackbone(**dict(TEACHER2, dropout=0.1)))
    distiller = Distiller(teacher, student_from_teacher(teacher.backbone, layers=(1,)))
    frozen = [to_numpy(v).copy() for v in teacher.weights]
    trainable = {id(v) for v in distiller.trainable_variables}
    assert not any(id(v) in trainable for v in teacher.weights)
    distiller.compile(learning_rate=3e-3)
    x, y, w = batch()
    history = distiller.fit(x, y, sample_weight=w, batch_size=8, epochs=10, verbose=0).history
    assert history["loss"][-1] < 0.85 * history["loss"][0]
    assert history["mlm_loss"][-1] < history["mlm_loss"][0]
    for before, after in zip(frozen, teacher.weights):
        np.testing.assert_array_equal(before, to_numpy(after))
    # The teacher runs without dropout even in training mode.
    a = to_numpy(distiller(x, training=True)["teacher_hidden"])
    b = to_numpy(distiller(x, training=True)["teacher_hidden"])
    np.testing.assert_array_equal(a, b)


def test_restrict_ce_to_mask():
    teacher = kb.tasks.MaskedLM(kb.models.BertBackbone(**TEACHER))
    distiller = Distiller(teacher, student_from_teacher(teacher.backbone, layers=(0, 1)),
                          restrict_ce_to_mask=True)
    x, y, w = batch()
    out = distiller(x)
    assert tuple(out["teacher_logits"].shape) == (8, 3, 60)
    assert float(to_numpy(distiller.losses_and_metrics(y, out, w)[0])) > 0


def test_save_reload(tmp_path):
    teacher = kb.tasks.MaskedLM(kb.models.BertBackbone(**TEACHER2))
    distiller = Distiller(teacher, student_from_teacher(teacher.backbone, layers=(1,)),
                          alpha_ce=3.0)
    x, _, _ = batch()
    path = str(tmp_path / "distiller.keras")
    distiller.save(path)
    loaded = keras.saving.load_model(path)
    before, after = distiller.predict(x, verbose=0), loaded.predict(x, verbose=0)
    for key in before:
        np.testing.assert_allclose(after[key], before[key], atol=1e-5, err_msg=key)
    assert loaded.alpha_ce == 3.0 and not loaded.teacher.trainable
    distiller.save_to_preset(str(tmp_path / "student"))
    student = kb.models.DistilBertBackbone.from_preset(str(tmp_path / "student"))
    features = {k: x[k] for k in student.input}
    np.testing.assert_allclose(to_numpy(student(features)["sequence_output"]),
                               before["student_hidden"], atol=1e-5)


def test_save_reload_with_shared_preprocessors(tmp_path):
    """A preprocessor or tokenizer the Distiller shares with its teacher or student (Keras saves
    a shared object's vocabulary once) reloads from `.keras`, shared again; unshared ones too."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(55)]
    tok = kb.preprocessing.WordPieceTokenizer(vocabulary=vocab, lowercase=True)
    config = dict(TEACHER, num_layers=1)  # the sharing is the point: one layer, the student's

    def pre(tokenizer=tok):
        return kb.preprocessing.MaskedLMPreprocessor(tokenizer, 10)

    def teacher(preprocessor=None):
        return kb.tasks.MaskedLM(kb.models.BertBackbone(**config), preprocessor=preprocessor)

    def student(t, preprocessor=None):
        backbone = student_from_teacher(t.backbone, layers=(0,))
        return backbone if preprocessor is None else kb.tasks.MaskedLM(backbone,
                                                                       preprocessor=preprocessor)

    def teachers(t):
        return Distiller(t, student(t))

    def distillers(t):
        return Distiller(t, student(t), preprocessor=pre())

    def with_teachers(t):
        return Distiller(t, student(t), preprocessor=t.preprocessor)

    def student_with_teachers(t):
        return Distiller(t, student(t, t.preprocessor))

    def all_three(t):
        return Distiller(t, student(t, t.preprocessor), preprocessor=t.preprocessor)

    def student_with_distillers(t):
        p = pre()
        return Distiller(t, student(t, p), preprocessor=p)

    def teachers_tokenizer(t):
        return Distiller(t, student(t), preprocessor=pre(t.preprocessor.tokenizer))

    def own(d):
        return d.preprocessor

    def teachers_pre(d):
        return d.teacher.preprocessor

    def students_pre(d):
        return d.student.preprocessor

    cases = {"teachers": (teachers, True, []),
             "distillers": (distillers, False, []),
             "default_preprocessor": (lambda t: Distiller(t, student(t), preprocessor=(
                 Distiller.default_preprocessor(tok, t.backbone, sequence_length=10))), False, []),
             "with_teachers": (with_teachers, True, [(own, teachers_pre)]),
             "student_with_teachers": (student_with_teachers, True, [(students_pre, teachers_pre)]),
             "all_three": (all_three, True, [(own, teachers_pre), (students_pre, teachers_pre)]),
             "student_with_distillers": (student_with_distillers, False, [(own, students_pre)]),
             "teachers_tokenizer": (teachers_tokenizer, True, [
                 (lambda d: d.preprocessor.tokenizer, lambda d: d.teacher.preprocessor.tokenizer)])}
    x, _, _ = batch(b=2)
    text = ["w1 w2 w3", "w4 w5"]
    for name, (make, teacher_has_one, shared) in cases.items():
        distiller = make(teacher(pre() if teacher_has_one else None))
        path = str(tmp_path / f"{name}.keras")
        distiller.save(path)
        loaded = keras.saving.load_model(path)
        for a, b in shared:
            assert a(distiller) is b(distiller) and a(loaded) is b(loaded), name
        for model, again in ((distiller, loaded), (distiller.teacher, loaded.teacher),
                             (distiller.student, loaded.student)):
            if model.preprocessor is None:
                assert again.preprocessor is None, name
                continue
            assert (again.preprocessor.tokenizer(text).to_list()
                    == model.preprocessor.tokenizer(text).to_list()), name
        np.testing.assert_allclose(to_numpy(loaded(x)["mlm_logits"]),
                                   to_numpy(distiller(x)["mlm_logits"]), atol=1e-5, err_msg=name)


SMALL = dict(TEACHER, num_layers=1)


@pytest.mark.multibackend
@pytest.mark.parametrize("teacher, student, options, error, message", [
    ("mlm", dict(SMALL, vocabulary_size=80), {}, ValueError,
     r"teacher's vocabulary_size \(60\) and the student's \(80\) must be equal"),
    (None, SMALL, {}, TypeError, r"Distiller's teacher is a MaskedLM or a kb.models backbone; "
                                 r"got NoneType None"),
    ("bert_base_en_uncased", SMALL, {}, TypeError, r"got str 'bert_base_en_uncased'"),
    ("dense", SMALL, {}, TypeError, r"got Dense"),
    ("mlm", SMALL, {"temperature": 0}, ValueError, r"temperature=0: expected a finite number > 0"),
    ("mlm", SMALL, {"temperature": -1.0}, ValueError, r"temperature=-1.0: expected a finite"),
    ("mlm", SMALL, {"temperature": float("nan")}, ValueError, r"temperature=nan: expected"),
    ("mlm", SMALL, {"temperature": "2"}, ValueError, r"temperature='2': expected"),
    ("mlm", SMALL, {"alpha_ce": -1.0}, ValueError, r"alpha_ce=-1.0: expected a finite number >= 0"),
    ("mlm", SMALL, {"alpha_cos": float("inf")}, ValueError, r"alpha_cos=inf: expected a finite"),
    ("mlm", SMALL, {"alpha_ce": 0, "alpha_mlm": 0, "alpha_cos": 0}, ValueError,
     r"alpha_ce=0, alpha_mlm=0, alpha_cos=0: every loss weighs 0"),
], ids=["vocabulary", "teacher_none", "teacher_str", "teacher_layer", "temperature_0",
        "temperature_negative", "temperature_nan", "temperature_str", "alpha_negative",
        "alpha_inf", "alphas_0"])
def test_distiller_refuses_what_it_cannot_distil(teacher, student, options, error, message):
    """Before: a student of another vocabulary was built (its logits failed in the loss), a
    teacher that is not a model was an AttributeError ('token_embedding'), and a temperature
    <= 0 or NaN gave NaN losses from the first step (temperature 0: loss nan, ce_loss nan)."""
    teacher = {"mlm": lambda: kb.tasks.MaskedLM(kb.models.BertBackbone(**SMALL),
                                                preprocessor=None),
               "dense": lambda: keras.layers.Dense(3)}.get(teacher, lambda: teacher)()
    with pytest.raises(error, match=message):
        Distiller(teacher, kb.models.BertBackbone(**student), **options)
