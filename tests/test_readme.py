"""The README's code runs as written: its Python tour end to end, and every documented shell
command's flags parse. The tour names files a user would have (a corpus directory, an HF
checkpoint, a RoBERTa directory); this test makes small real ones in a temporary working
directory and runs the block there, offline."""
import os
import re
import shlex

import pytest

from keras_bertfam import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blocks(language):
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def make_user_files(root):
    """What the tour reads: text directories, an HF BERT checkpoint, an HF ALBERT pretraining
    checkpoint with its SentencePiece model (for convert_task) and an HF RoBERTa directory (for
    from_roberta), all small. `export_to_transformers` writes the HF directories (config.json and
    model.safetensors in HF's names, which `transformers` loads: test_conversion, test_presets),
    not transformers' torch models: the tour reads them with safetensors and NumPy, and importing
    transformers' torch models to write them was ~7 s of this test's ~70 s of CPU."""
    import pathlib

    import keras_bertfam as kb
    from tests.conftest import default_corpus_documents

    root = pathlib.Path(root)
    # default_corpus()'s first 40 documents, without starting its pipeline
    docs = [d.decode() for d in default_corpus_documents(0, 40)]
    # the pretraining corpus: 10 reviews, a batch or two of the tour's pretrainer (40: four
    # batches, ~1.5 s of CPU more); the vocabulary trainer's the same 10 (40: ~1.2 s more); the
    # SentencePiece model's below all 40 (its 300 pieces)
    for name, texts in (("my_domain_texts", docs[:10]), ("texts", docs[:10])):
        os.makedirs(root / name)
        for i in range(2):
            (root / name / f"part{i}.txt").write_text("\n".join(texts[i::2]))
    small = dict(vocabulary_size=300, num_layers=1, num_heads=2, hidden_dim=16,
                 intermediate_dim=32, max_sequence_length=34)
    kb.presets.export_to_transformers(kb.models.BertBackbone(**small),
                                      str(root / "path" / "to" / "hf_model_dir"))
    # convert_task attaches the default preprocessor: 128 positions at least
    albert = kb.models.AlbertBackbone(**dict(small, embedding_dim=8, max_sequence_length=128))
    kb.presets.export_to_transformers(kb.tasks.AlbertPretrainer(albert, preprocessor=None),
                                      str(root / "hf_dir"))
    kb.preprocessing.train_sentencepiece_model(docs, 300, output_file=str(root / "hf_dir" /
                                                                          "spiece.model"))
    kb.presets.export_to_transformers(kb.models.RobertaBackbone(**small), str(root / "roberta_dir"))
    return root


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    monkeypatch.chdir(make_user_files(tmp_path))
    return tmp_path


def test_the_python_tour_runs_as_written(user_files):
    (tour,) = _blocks("python")
    namespace = {}
    exec(compile(tour, "README.md (tour)", "exec"), namespace)
    for name in ("backbone", "clf", "pretrainer", "longformer", "curve", "small", "stages"):
        assert name in namespace, name
    # what the tour says it writes
    for path in ("vocab.txt", "grid.png", "my_preset", os.path.join("serving", "1"), "hf_out"):
        assert os.path.exists(user_files / path), path
    assert namespace["small"].backbone.num_params() < namespace["clf"].backbone.num_params()


def test_every_documented_command_parses():
    parser = cli._parser()
    lines = [line.split("#")[0].strip() for block in _blocks("bash") for line in block.splitlines()]
    values = {"N": "100", "PATH": "texts/", "DIR": "run"}  # the README's placeholders
    commands = [[values.get(a, a) for a in shlex.split(line)[1:]] for line in lines
                if line.startswith("keras-bertfam")]
    assert len(commands) == 5
    for argv in commands:
        args = parser.parse_args(argv)  # exits (SystemExit) on an unknown flag
        assert args.command == argv[0]
    makes = [line.split()[1] for line in lines if line.startswith("make ")]
    with open(os.path.join(ROOT, "Makefile")) as f:
        targets = re.findall(r"^([\w-]+):", f.read(), flags=re.M)
    assert makes == ["pretrain", "test"] and set(makes) <= set(targets)
