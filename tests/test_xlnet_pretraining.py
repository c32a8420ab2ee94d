"""XLNet from raw text: XLNetTokenizer (HF / slow-algorithm parity), presets, raw-text PLM
pretraining with segment recurrence, the CLI."""
import os

import numpy as np
import pytest

from keras_bertfam import presets
from keras_bertfam.models.xlnet import XLNetBackbone
from keras_bertfam.tasks.xlnet_pretrainer import XLNetPretrainer
from tests.conftest import (
    ODD_SENTENCEPIECE_TEXTS,
    check_sentencepiece_offsets,
    default_corpus_documents,
    equal_up_to_ties,
    slow_sentencepiece_ids,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


# === XLNetTokenizer ===


@pytest.fixture(scope="module")
def xlnet_spiece(tmp_path_factory):
    """A small XLNet-recipe SentencePiece model trained on the default corpus, in an HF-format
    directory (spiece.model)."""
    from keras_bertfam.preprocessing.tokenizers import train_xlnet_sentencepiece_model

    directory = tmp_path_factory.mktemp("xlnet_spm")  # (= default_corpus().take(800))
    train_xlnet_sentencepiece_model(list(default_corpus_documents(0, 800)), 2000,
                                    output_file=str(directory / "spiece.model"))
    return directory


@pytest.fixture(scope="module")
def heldout_sentences():
    """The sentences of IMDB documents 20,000-20,299 (the models here train on the first 800)."""
    from keras_bertfam.preprocessing import corpus

    docs = default_corpus_documents(20000, 300)  # = default_corpus().skip(20000).take(300)
    return [s.decode() for s in corpus.split_sentences(docs).flat_values.numpy()]


def test_xlnet_tokenizer_ids_equal_slow_and_hf_xlnet_tokenizers(xlnet_spiece, heldout_sentences):
    import sentencepiece

    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    path = str(xlnet_spiece / "spiece.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    assert [sp.id_to_piece(i) for i in range(9)] == [
        "<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]
    tok = XLNetTokenizer(path)
    assert (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id,
            tok.unk_token_id) == (3, 4, 5, 6, 0)
    assert (tok.bos_token_id, tok.eos_token_id, tok.eod_token_id, tok.eop_token_id) == (1, 2, 7, 8)
    assert tok.special_token_ids == list(range(9))
    sentences = heldout_sentences + [
        "Hello  world", "``quoted''", "Café NAÏVE 😀 ΣΑΣ", "tabs\tand\nnewlines ",
        "1,000,000.5 in 1990, yes", "x\x85y\u3000z", "   ", ""]
    assert len(sentences) > 3000
    ours = tok(sentences).to_list()
    slow = [slow_sentencepiece_ids(sp, s, lowercase=False) for s in sentences]
    # Measured: 3,783 of 3,795 identical; the other 12 are equal-score segmentations.
    assert all(equal_up_to_ties(sp, a, b) for a, b in zip(ours, slow))
    assert sum(a == b for a, b in zip(ours, slow)) >= 0.99 * len(sentences)
    # Cased: no lowercasing (HF's do_lower_case=False); accents dropped (keep_accents=False).
    assert [sp.id_to_piece(i) for i in tok(["Café"]).to_list()[0]] == [
        sp.id_to_piece(i) for i in sp.encode("Cafe")]
    hf = transformers.XLNetTokenizer.from_pretrained(str(xlnet_spiece))
    fast = [hf(s, add_special_tokens=False)["input_ids"] for s in sentences]
    assert all(equal_up_to_ties(sp, a, b) for a, b in zip(ours, fast))
    assert sum(a == b for a, b in zip(ours, fast)) >= 0.99 * len(fast)  # measured 3,779
    # HF's special-token layout is xlnet_pack's: A <sep> B <sep> <cls>, left padding.
    from keras_bertfam.preprocessing.packing import xlnet_pack

    a, b = "A short one.", "And a second, longer sentence."
    ref = hf(a, b, padding="max_length", max_length=24, return_token_type_ids=True)
    packed = xlnet_pack(tok([a]), tok([b]), 24, tok.sep_token_id, tok.cls_token_id,
                        tok.pad_token_id)
    assert packed["token_ids"].numpy()[0].tolist() == ref["input_ids"]
    assert packed["padding_mask"].numpy()[0].tolist() == ref["attention_mask"]
    real = np.array(ref["attention_mask"], bool)  # HF 5 pads segment ids with 0, HF 4 with 3
    np.testing.assert_array_equal(packed["segment_ids"].numpy()[0][real],
                                  np.array(ref["token_type_ids"])[real])


def test_xlnet_digit_comma_fix_up_on_a_cased_model():
    import io

    import sentencepiece

    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    lines = [f"In {y}, the Year {y + 1}, came; A{y % 7}, b {y % 10}," for y in range(1900, 2000)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 5), model_writer=model, vocab_size=300,
        hard_vocab_limit=False, split_by_number=False,
        control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>"], minloglevel=2)
    sp = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    assert [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
            if p[-1:] == "," and len(p) > 1 and p[-2].isdigit()]  # pieces such as "0,"
    tok = XLNetTokenizer(model.getvalue())
    texts = lines[:40] + ["In 1990, x1995, and 7,"]
    ours = tok(texts).to_list()
    assert ours == [slow_sentencepiece_ids(sp, t, lowercase=False) for t in texts]
    assert ours != [sp.encode(t) for t in texts]  # the fix-up changed something


def test_xlnet_offsets_equal_hf_xlnet_tokenizer(xlnet_spiece, heldout_sentences):
    """`tokenize_with_offsets` on XLNet's cased SentencePiece tokenizer: the tokenizer's ids and
    HF `XLNetTokenizer`'s offset mapping, on held-out IMDB sentences and odd text."""
    import sentencepiece

    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    path = str(xlnet_spiece / "spiece.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    hf = transformers.XLNetTokenizer.from_pretrained(str(xlnet_spiece))
    texts = ODD_SENTENCEPIECE_TEXTS + ["<eop> x", "Straße İ"] + heldout_sentences
    same, other = check_sentencepiece_offsets(XLNetTokenizer(path), hf, sp, texts,
                                              lowercase=False)
    # Measured: 3,810 of 3,827 texts; the other 17 are SentencePiece ties ("!!!!", "60,000").
    assert same >= 0.99 * len(texts) and other <= 25, (same, other)
    # Bytes that are not UTF-8: U+FFFD for the tokenizer as for the offsets and HF (the
    # tokenizer gave a 0xFF byte a piece and an <unk>, the offsets and HF nothing)
    import tensorflow as tf

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets

    bad = [b"caf\xc3\xa9 \xff b", b"a\xe9b c", b"x\xed\xa0\x80y", b"\xe6\x9d"]
    ids = tokenize_with_offsets(XLNetTokenizer(path), tf.constant(bad))[0].to_list()
    assert ids == XLNetTokenizer(path)(tf.constant(bad)).to_list()
    assert ids == [hf(t.decode("utf-8", "replace"), add_special_tokens=False)["input_ids"]
                   for t in bad]


def test_xlnet_text_cut_at_eop_keeps_its_nul_bytes():
    """The text on each side of `<eop>` gives the ids (and offsets) it gives alone, NUL bytes
    included: the cut reads a NUL as the byte 0xFF (tf-text's regex split stops at a NUL) and
    must give it back, or a byte-fallback model reads U+FFFD's three bytes where SentencePiece
    reads "<0x00>" (the HF tokenizer reads "<unk>" for any byte piece: no reference here)."""
    import io

    import sentencepiece
    import tensorflow as tf

    from keras_bertfam.preprocessing.offsets import tokenize_with_offsets
    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([f"the cat {i} sat on a mat" for i in range(100)]),
        model_writer=model, vocab_size=290, byte_fallback=True, user_defined_symbols=["<eop>"],
        control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>"], minloglevel=2)
    sp = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    tok = XLNetTokenizer(model.getvalue())
    assert tok.tokens_read_alone == ("<eop>",)
    sides = [("a\x00b", "\x00"), ("\x00", "x\x00 y"), ("", "\x00\x00"), ("é\x00", "")]
    ids = tok([a + "<eop>" + b for a, b in sides]).to_list()
    assert ids == [slow_sentencepiece_ids(sp, a, lowercase=False) + [tok.eop_token_id]
                   + slow_sentencepiece_ids(sp, b, lowercase=False) for a, b in sides]
    assert tok.token_to_id("<0x00>") in ids[0]
    with_offsets = tokenize_with_offsets(tok, tf.constant([a + "<eop>" + b for a, b in sides]))
    assert with_offsets[0].to_list() == ids


def test_xlnet_special_tokens_written_in_text_against_hf(xlnet_spiece):
    """XLNet's special tokens written in a text, at its start, middle and end, with and without
    spaces around. `<eop>` is a user-defined piece (SentencePiece reads it whole): the ids and
    offsets are HF `XLNetTokenizer`'s, which reads the text on each side of it as a text of its
    own ("a <eop> b" had one "▁" more than HF's, "a<eop>b" "b" where HF has "▁b"). The control
    pieces (`<eod>`, `<sep>`, `<cls>`, `<mask>`, `<pad>`) are split into pieces as the
    SentencePiece model reads the characters (README, literal special tokens; HF reads its ids)."""
    import sentencepiece

    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    path = str(xlnet_spiece / "spiece.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    hf = transformers.XLNetTokenizer.from_pretrained(str(xlnet_spiece))
    tok = XLNetTokenizer(path)
    forms = ["a {} b", "a{}b", "{} a", "{}a", "a {}", "a{}", "{}", "  {}  ", "a  {}\tb",
             "{}{}", "{} {}", "In 1990,{}x", "x{}\x00 y", "Café {}naïve"]
    # the token next to NULs and non-ASCII, repeated; texts without it in the same batch
    eop = [f.replace("{}", "<eop>") for f in forms + [
        "\x00{}\x00", "{}\x00{}", "\x00\x00{}", "ü{}é", "東{}{} {}京", "{}\x00", ""]] + [
        "", "\x00", "a\x00b", "<eop", "eop>", "<<eop>>", "<e<eop>op>"]
    same, other = check_sentencepiece_offsets(tok, hf, sp, eop, lowercase=False)
    assert (same, other) == (len(eop), 0)
    controls = [f.replace("{}", t) for t in ("<eod>", "<sep>", "<cls>", "<mask>", "<pad>")
                for f in forms]
    ours = tok(controls).to_list()
    assert ours == [slow_sentencepiece_ids(sp, t, lowercase=False) for t in controls]
    assert not set(sum(ours, [])) & {3, 4, 5, 6, 7}


# A user's own XLNet SentencePiece model with user-defined pieces besides `<eop>`: transformers
# 5's `XLNetTokenizer` makes each an added token (found as written, before normalization) and
# reads the text on each side of it as a text of its own.
USER_PIECES = ("<eop>", "[X]", "ab", "é")


@pytest.fixture(scope="module")
def xlnet_user_pieces_dirs(tmp_path_factory):
    """HF XLNet directories of a 300-piece model with `USER_PIECES` (trained once): spiece.model
    + config.json, and the same saved by transformers 5 (tokenizer.json, no spiece.model)."""
    from keras_bertfam.preprocessing.tokenizers import train_xlnet_sentencepiece_model

    spiece, saved = (tmp_path_factory.mktemp(n) for n in ("xlnet_user_spm", "xlnet_user_hf5"))
    train_xlnet_sentencepiece_model(list(default_corpus_documents(0, 60)), 300,
                                    output_file=str(spiece / "spiece.model"),
                                    user_defined_symbols=USER_PIECES)
    transformers.XLNetConfig(vocab_size=300, d_model=16, n_layer=1, n_head=2,
                             d_inner=32).save_pretrained(str(spiece))
    transformers.XLNetTokenizer.from_pretrained(str(spiece)).save_pretrained(str(saved))
    (saved / "spiece.model").unlink(missing_ok=True)
    (saved / "config.json").write_text((spiece / "config.json").read_text())
    return spiece, saved


def test_xlnet_user_defined_pieces_read_as_hf_reads_them(xlnet_user_pieces_dirs):
    """Every user-defined piece of the model (not only `<eop>`) written in a text is its id,
    and the text on each side of it a text of its own, cut before normalization as HF cuts at
    its added tokens: ids and offsets are transformers 5's `XLNetTokenizer`'s, loaded from an
    HF directory with spiece.model and from one transformers 5 saved (tokenizer.json). Before,
    only `<eop>` was cut ("a[X]b": "b" where HF has "▁b"; "a [X] b" a "▁" more), and the cut
    ran on the normalized text ("Café" and "＜eop＞" cut where HF reads them whole)."""
    import sentencepiece

    spiece, saved = xlnet_user_pieces_dirs
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spiece / "spiece.model"))
    assert [sp.id_to_piece(i) for i in range(9, 12)] == ["[X]", "ab", "é"]
    forms = ["{}", "{}{}", "{} {}", "a {} b", "a{}b", "{}a", "a{}", "  {}\t", "word{}word",
             "Naïve{}ünï", "東{}京", "x{}\x00y", "In 1990,{}x", "The {} film, the {}."]
    texts = [f.replace("{}", p) for p in USER_PIECES for f in forms] + [
        "[X]<eop>abé", "ab[X]ab", "[[X]]", "<eop[X]>", "cabbage", "Café", "CAFÉ", "cafe\u0301",
        "＜eop＞", "[x] AB <EOP>", "aab", "", " "]
    for directory in (spiece, saved):
        hf = transformers.XLNetTokenizer.from_pretrained(str(directory))
        tok = presets.load_tokenizer(str(directory))
        same, other = check_sentencepiece_offsets(tok, hf, sp, texts, lowercase=False)
        assert (same, other) == (len(texts), 0), directory
        assert set(tok.tokens_read_alone) == set(USER_PIECES)


def test_xlnet_spiece_model_beside_tokenizer_json_reads_what_hf_adds(xlnet_user_pieces_dirs,
                                                                      tmp_path):
    """A directory with both spiece.model and tokenizer.json: transformers 5 reads
    tokenizer.json, so a user-defined piece of spiece.model that tokenizer.json (and
    tokenizer_config.json) do not add as a token is an ordinary piece of HF's Unigram model, not
    cut out of a text. The loader reads spiece.model with HF's added tokens: ids and offsets
    equal HF's (after the cut at every user-defined piece, "a[X]b" gave "▁b" where HF has "b")."""
    import json
    import shutil

    import sentencepiece

    spiece, saved = xlnet_user_pieces_dirs
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spiece / "spiece.model"))
    both = tmp_path / "both"
    shutil.copytree(saved, both)
    shutil.copy(spiece / "spiece.model", both / "spiece.model")
    spec = json.loads((both / "tokenizer.json").read_text())
    spec["added_tokens"] = [e for e in spec["added_tokens"] if e["content"] not in ("[X]", "ab")]
    (both / "tokenizer.json").write_text(json.dumps(spec))
    config = json.loads((both / "tokenizer_config.json").read_text())
    config["extra_special_tokens"] = [t for t in config.get("extra_special_tokens", [])
                                      if t not in ("[X]", "ab")]
    (both / "tokenizer_config.json").write_text(json.dumps(config))
    hf = transformers.XLNetTokenizer.from_pretrained(str(both))
    texts = ["a[X]b", "a [X] b", "cabbage", "ab[X]ab", "Café<eop>éb", "x<eop>[X]", "[X]"]
    assert hf.tokenize("a[X]b") == ["▁a", "[X]", "b"]  # not cut: read by the model
    tok = presets.load_tokenizer(str(both))
    same, other = check_sentencepiece_offsets(tok, hf, sp, texts, lowercase=False)
    assert (same, other) == (len(texts), 0)
    assert set(tok.tokens_read_alone) == {"<eop>", "é"}
    # both files as transformers 5 saves them (the same tokens): all four read alone
    shutil.copy(spiece / "spiece.model", saved / "spiece.model")
    try:
        assert set(presets.load_tokenizer(str(saved)).tokens_read_alone) == set(USER_PIECES)
    finally:
        (saved / "spiece.model").unlink()


def test_xlnet_tokenizer_from_hf_dir_preset_round_trip_and_offline_error(xlnet_spiece, tmp_path):
    import json

    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    texts = ["An XLNet test, in 1990, with Accents: café."]
    direct = XLNetTokenizer(str(xlnet_spiece / "spiece.model"))
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "spiece.model").write_bytes((xlnet_spiece / "spiece.model").read_bytes())
    transformers.XLNetConfig(vocab_size=2000, d_model=16, n_layer=1, n_head=2,
                             d_inner=32).save_pretrained(str(hf_dir))
    from_hf = presets.load_tokenizer(str(hf_dir))  # no tokenizer_config.json: HF's defaults
    assert isinstance(from_hf, XLNetTokenizer) and not from_hf.lowercase
    assert from_hf(texts).to_list() == direct(texts).to_list()
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    lowered = presets.load_tokenizer(str(hf_dir))
    assert lowered.lowercase and lowered(["ABC"]).to_list() == direct(["abc"]).to_list()
    presets.save_backbone(XLNetBackbone(2000, 1, 2, 16, 32), str(tmp_path / "preset"),
                          tokenizer=direct)
    loaded = presets.load_tokenizer(str(tmp_path / "preset"))
    assert isinstance(loaded, XLNetTokenizer)
    assert loaded(texts).to_list() == direct(texts).to_list() == from_hf(texts).to_list()
    assert loaded.eod_token_id == 7 and loaded.cls_token_id == 3
    with pytest.raises(FileNotFoundError, match="spiece.model.*not installed offline"):
        presets.load_tokenizer("xlnet_base_en")


# === Pretraining from raw text ===


def test_xlnet_pretrains_from_raw_text_with_segment_recurrence(xlnet_spiece):
    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor
    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer

    tok = XLNetTokenizer(str(xlnet_spiece / "spiece.model"))
    # one layer: its memory is what the recurrence carries (depth is not checked here)
    backbone = XLNetBackbone(tok.vocabulary_size(), 1, 2, 32, 64, mem_len=16, reuse_len=16)
    pre = XLNetPretrainer.default_preprocessor(tok, backbone, sequence_length=48, batch_size=4,
                                               window_steps=4, seed=2)
    assert isinstance(pre, XLNetPreprocessor) and pre.reuse_len == 16
    task = XLNetPretrainer.pretraining_task(backbone, pre)
    assert task.memory is not None and task.memory_batch_size == 4
    # 12 reviews: ~48 steps an epoch (40 gave 156, and the loss falls as clearly).
    texts = [t.decode() for t in default_corpus_documents(0, 12)]  # default_corpus().take(12)
    task.compile(learning_rate=3e-3)
    history = task.fit(texts, epochs=3, verbose=0)
    losses = history.history["plm_loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert np.abs(task.memory.memory.numpy()).sum() > 0


def test_cli_pretrains_xlnet_from_an_hf_dir_and_saves_a_loadable_preset(xlnet_spiece, tmp_path):
    """`keras-bertfam pretrain` (cli.main, in this process: the console script is
    `sys.exit(main())`; tests/test_cli.py runs it as a process)."""
    import json
    import shutil

    from keras_bertfam import cli
    from keras_bertfam.preprocessing.tokenizers import XLNetTokenizer
    from keras_bertfam.run_directory import RunDirectory

    tok = XLNetTokenizer(str(xlnet_spiece / "spiece.model"))
    hf_dir = tmp_path / "hf"
    transformers.XLNetModel(transformers.XLNetConfig(
        vocab_size=tok.vocabulary_size(), d_model=16, n_layer=1, n_head=2,
        d_inner=32)).save_pretrained(str(hf_dir))
    shutil.copy(xlnet_spiece / "spiece.model", hf_dir / "spiece.model")
    for source, name in ((str(hf_dir), "hf"),):  # our preset dirs: loaded back below
        out = tmp_path / f"run_{name}"
        argv = ["pretrain", "--family", "xlnet", "--preset", source, "--steps", "4",
                "--checkpoint-every", "2", "--no-export", "--batch-size", "2",
                "--sequence-length", "24", "--output", str(out), "--quiet"]
        assert cli.main(argv) == 0
        _, where = RunDirectory(str(out)).latest(["training_state.json"])
        state = json.loads(open(os.path.join(where, "training_state.json")).read())
        assert state["step"] == 4 and [h["step"] for h in state["history"]] == [2, 4]
        assert all(np.isfinite(h["plm_loss"]) for h in state["history"])
        loaded = XLNetPretrainer.from_preset(str(out / "preset"))  # our preset dir
        assert isinstance(loaded.preprocessor.tokenizer, XLNetTokenizer)
        assert loaded.preprocessor.sequence_length == 24


# === .keras files ===
KERAS_FILE_LINES = [f"The film number {i} was great and the plot was dull {i % 7}. The actor "
                    f"who wrote it lives in Paris." for i in range(300)]


def test_every_xlnet_task_round_trips_a_keras_file_with_its_preprocessor(tmp_path):
    """Issue 13: `model.save("x.keras")` then `keras.saving.load_model` of every XLNet task with
    its preprocessor; predict after the load equals predict before, and for the pretrainer one
    epoch of fit on the loaded task equals one on the original (both from the saved state; a
    fine-tuning task's fit after a `.keras` reload is test_resume's). XLNetPreprocessor read
    the tokenizer's <sep> / <cls> ids at construction, when a `.keras` file's tokenizer has no
    vocabulary yet: load_model failed with "The tokenizer has no sep_token_id" (the pretraining
    preprocessors' packers had the same defect, fixed in fb39eb6)."""
    import keras

    import keras_bertfam as kb
    from keras_bertfam.preprocessing import finetuning as ft
    from keras_bertfam.preprocessing.permutation import XLNetPreprocessor
    from keras_bertfam.preprocessing.tokenizers import (XLNetTokenizer,
                                                        train_xlnet_sentencepiece_model)

    spiece = str(tmp_path / "spiece.model")
    train_xlnet_sentencepiece_model(KERAS_FILE_LINES * 3, 60, output_file=spiece)
    tok = XLNetTokenizer(spiece)
    keras.utils.set_random_seed(3)

    def backbone():  # no dropout: a restored layer draws its dropout seed anew (Keras)
        return XLNetBackbone(tok.vocabulary_size(), 1, 2, 16, 32, dropout=0.0)

    texts = ["The film was great.", "The plot was dull and the actor wrote it."]
    question, context = ["Where does the actor live?"] * 2, [KERAS_FILE_LINES[0]] * 2
    choices = [["was great", "lives in Paris"], ["was dull", "wrote it"]]
    cases = {  # task, predict's x
        "XLNetPretrainer": (
            XLNetPretrainer(backbone(), preprocessor=XLNetPreprocessor(
                tok, 16, batch_size=2, window_steps=1, seed=1)),
            None),
        "TextClassifier": (
            kb.tasks.TextClassifier(backbone(), num_classes=2, dropout=0.0,
                                    preprocessor=ft.TextClassifierPreprocessor(tok, 16)),
            texts),
        "TokenClassifier": (
            kb.tasks.TokenClassifier(backbone(), num_classes=3, dropout=0.0,
                                     preprocessor=ft.TokenClassifierPreprocessor(tok, 16)),
            texts),
        "QuestionAnswerer": (
            kb.tasks.QuestionAnswerer(backbone(), preprocessor=ft.QuestionAnswererPreprocessor(
                tok, 32, stride=8, max_question_length=8)),
            (question, context)),
        "MultipleChoice": (
            kb.tasks.MultipleChoice(backbone(), dropout=0.0,
                                    preprocessor=ft.MultipleChoicePreprocessor(tok, 16)),
            (texts, choices)),
        "SentenceEncoder": (
            kb.tasks.SentenceEncoder(backbone(),
                                     preprocessor=ft.TextClassifierPreprocessor(tok, 16)),
            texts),
    }
    for name, (task, x) in cases.items():
        if getattr(task, "follows_xlnet_layout", False):  # (SentenceEncoder: mean pooling)
            assert task.preprocessor.packing_layout == "xlnet", name
        if name == "XLNetPretrainer":
            task.compile(learning_rate=1e-3)
        path = str(tmp_path / f"{name}.keras")
        task.save(path)
        loaded = keras.saving.load_model(path)
        assert type(loaded) is type(task) and type(loaded.preprocessor) is type(task.preprocessor)
        if name == "XLNetPretrainer":
            batch = next(iter(task.preprocessor.prepare(KERAS_FILE_LINES[:4])))[0]
            assert batch["token_ids"].shape == (2, 16)
            again = next(iter(loaded.preprocessor.prepare(KERAS_FILE_LINES[:4])))[0]
            for key in batch:  # the loaded preprocessor's batches: the same (seed=1)
                np.testing.assert_array_equal(again[key], batch[key], err_msg=key)
            before, after = task(batch), loaded(batch)
            np.testing.assert_allclose(keras.ops.convert_to_numpy(after),
                                       keras.ops.convert_to_numpy(before), atol=1e-6)
        else:
            got, expected = loaded.predict(x, verbose=0), task.predict(x, verbose=0)
            if isinstance(expected, dict):  # QA's start / end logits
                assert got.keys() == expected.keys()
                got, expected = [got[k] for k in sorted(got)], [expected[k] for k in
                                                                sorted(expected)]
            np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=name)
        if name != "XLNetPretrainer":
            continue
        histories = []
        for model in (task, loaded):
            keras.utils.set_random_seed(5)
            history = model.fit(KERAS_FILE_LINES[:4], epochs=1, verbose=0)
            histories.append(history.history)
        assert histories[0].keys() == histories[1].keys()
        for key in histories[0]:
            np.testing.assert_allclose(histories[1][key], histories[0][key], rtol=1e-5,
                                       err_msg=f"{name}:{key}")
        for a, b in zip(task.weights, loaded.weights):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(b),
                                       keras.ops.convert_to_numpy(a), atol=1e-6,
                                       err_msg=f"{name}:{a.path}")
