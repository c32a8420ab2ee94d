"""Short real runs of the ELECTRA, SpanBERT and DistilBERT objectives on the default corpus.

IMDB reviews (the default corpus) -> BERT's uncased WordPiece tokenizer -> each task's default
preprocessor -> `fit()` on the raw strings: tiny models trained from scratch (electra, spanbert)
or a student of the real MiniLM (distil). Prints the losses (mean over each block of steps).

    python examples/pretrain_objectives.py --objective electra|spanbert|distil [--steps N]

- electra: ElectraPretrainer (discriminator L4/H128/E64, generator 1/4 width), ELECTRA masking
  (15%, 85% [MASK] / 15% unchanged).
- spanbert: SpanBertPretrainer (L4/H128) on SpanBertPreprocessor (span masking + boundaries).
- distil: the real pretrained MiniLM (`all_minilm_l6_v2`, 6 x 384, offline) fine-tuned as a
  MaskedLM for --teacher-steps steps, then distilled into a 3-layer DistilBERT student
  initialized from its embeddings and layers 0, 2, 4 (DistilBERT's recipe), for --steps steps.
  The first 512 reviews are held out (electra's held-out check; never trained on).

Measured runs below (TensorFlow backend, 2 CPU cores shared with other jobs, load average 3-8,
seed 1, sequence length 64; each objective's defaults in DEFAULTS).

electra (329s; defaults: --steps 600 --block 50, batch 32, lr 2e-3, initial weights' stddev
0.1; loss = mlm_loss + 50 * rtd_loss):

        steps      mlm_loss      rtd_loss  rtd_accuracy          loss
       1-50           9.829         0.444         0.836        32.012
      51-100          7.109         0.412         0.844        27.709
     101-150          6.650         0.426         0.846        27.963
     151-200          6.405         0.425         0.848        27.671
     201-250          6.384         0.421         0.849        27.419
     251-300          6.255         0.416         0.851        27.050
     301-350          6.191         0.413         0.853        26.853
     351-400          6.220         0.412         0.854        26.801
     401-450          6.207         0.410         0.855        26.687
     451-500          6.162         0.408         0.855        26.572
     501-550          6.124         0.409         0.855        26.556
     551-600          6.056         0.407         0.856        26.400
    held out (32623 tokens): replaced share 0.143, base-rate loss H(p) 0.411; discriminator
    loss 0.406, AUC 0.540, mean p(replaced) 0.144 on replaced vs 0.138 on original tokens

  The generator's MLM loss falls 9.83 -> 6.06. A discriminator that only knows the base rate
  ("14% of tokens are replaced") has loss H(p) = 0.411 and AUC 0.5; on 512 held-out reviews
  this one scores 0.406 and AUC 0.540: it has started to tell replaced tokens from original
  ones, barely. With ELECTRA's own stddev 0.02 (the previous recording, 120 steps at
  batch 16, and a 600-step run with the defaults above but stddev 0.02) it did not: held-out
  loss 0.422 = H(p) 0.422, AUC 0.524, the same mean p(replaced) 0.141 on both kinds of token.
  (The training rtd_loss is not comparable across blocks on its own: the replaced share falls
  as the generator improves.)
  Twice the steps do not widen the margin: `--steps 1200 --block 100` (416s at load average
  0.5-1.6) ended with generator MLM 5.87, training rtd_loss 0.399, and held out 0.398 vs H(p)
  0.403, AUC 0.541 (mean p(replaced) 0.141 on replaced vs 0.135 on original tokens).

spanbert (56s on 2 idle cores, 2026-11-22, whole-word spans; loss = mlm_loss + sbo_loss):

        steps      mlm_loss      sbo_loss  mlm_accuracy          loss
       1-20           9.367         9.365         0.031        18.732
      21-40           7.107         7.105         0.044        14.212
      41-60           6.941         6.939         0.044        13.880
      61-80           6.943         6.942         0.048        13.885
      81-100          6.926         6.929         0.040        13.855
     101-120          6.822         6.824         0.045        13.646

  Both heads fall together to about the unigram entropy (token frequencies); neither the span
  boundaries nor the context are exploited yet at this size and budget.

distil (252s in all; defaults: teacher 200 steps at lr 5e-4, student --steps 150 --block 25,
batch 16, lr 2e-4). The teacher, MiniLM fine-tuned as a MaskedLM:

        steps      mlm_loss  mlm_accuracy
       1-25           7.487         0.036
      26-50           6.577         0.072
      51-75           6.049         0.116
      76-100          5.664         0.173
     101-125          5.355         0.188
     126-150          5.263         0.211
     151-175          5.195         0.210
     176-200          5.059         0.232

  then the 3-layer student (17.2M parameters; loss = 5 * ce_loss + 2 * mlm_loss + cos_loss, the
  KL on the masked slots: `restrict_ce_to_mask=True`):

        steps       ce_loss      mlm_loss      cos_loss  mlm_accuracy          loss
       1-25           0.555         5.953         0.435         0.151        15.118
      26-50           0.290         5.482         0.319         0.177        12.734
      51-75           0.251         5.342         0.285         0.193        12.224
      76-100          0.230         5.230         0.268         0.213        11.879
     101-125          0.214         5.219         0.259         0.206        11.766
     126-150          0.211         5.176         0.255         0.211        11.662

  Every term falls in every block: KL 0.555 -> 0.211, the student's MLM 5.95 -> 5.18 (accuracy
  0.15 -> 0.21, near the teacher's 0.23), cosine 0.435 -> 0.255; total 15.12 -> 11.66 (-23%).
  The previous recording (a 4-layer teacher trained from scratch for 120 steps, which had only
  learned token frequencies, and a 2-layer student) fell 1.4%, not monotonically. A first try
  with only MiniLM's new head fitted (backbone frozen, 100 steps: teacher MLM 6.72, accuracy
  0.06) gave a weak teacher: the student's total fell 15.85 -> 12.96 but its KL rose after the
  first block (0.083 -> 0.118) as its own MLM overtook the teacher's.
"""
import argparse
import math
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_bertfam as kb  # noqa: E402
from keras_bertfam.preprocessing import corpus  # noqa: E402
from keras_bertfam.tasks.distiller import student_from_teacher  # noqa: E402

# Per objective: steps, block, batch size, learning rate, initial weights' stddev (the runs
# recorded above; distil starts from MiniLM's weights).
DEFAULTS = {
    "electra": dict(steps=600, block=50, batch_size=32, learning_rate=2e-3,
                    initializer_range=0.1),
    "spanbert": dict(steps=120, block=20, batch_size=16, learning_rate=2e-3,
                     initializer_range=0.02),
    "distil": dict(steps=150, block=25, batch_size=16, learning_rate=2e-4,
                   initializer_range=None),
}
HELD_OUT = 512  # the first documents of the corpus: never trained on (electra, distil)


def run(task, texts, args, keys, steps=None, learning_rate=None):
    steps = steps or args.steps
    task.compile(learning_rate=learning_rate or args.learning_rate, warmup_steps=steps // 10,
                 total_steps=steps)
    history = task.fit(texts, steps_per_epoch=args.block, epochs=steps // args.block,
                       verbose=0).history
    print(f"{'steps':>9}  " + "  ".join(f"{k:>12}" for k in keys))
    for i in range(len(history[keys[0]])):
        print(f"{i * args.block + 1:>4}-{(i + 1) * args.block:<4}  "
              + "  ".join(f"{history[k][i]:12.3f}" for k in keys))
    return history


def electra_held_out(task, texts, batches=16):
    """The discriminator on held-out text against the base rate.

    A discriminator that only knows "most tokens are original" scores every token with the
    replaced share p: its loss is the entropy H(p) and its AUC 0.5. Below H(p) (and AUC > 0.5)
    it tells replaced tokens from original ones.
    """
    labels, probs = [], []
    for x, mask_ids, mask_weights in task.preprocessor.prepare(texts).take(batches):
        y_pred = task(x, training=False)
        tokens = keras.ops.convert_to_numpy(x["padding_mask"]).astype(bool)
        label = keras.ops.convert_to_numpy(task.rtd_labels(mask_ids, mask_weights, y_pred))
        prob = keras.ops.convert_to_numpy(keras.ops.sigmoid(y_pred["rtd_logits"]))
        labels.append(label[tokens])
        probs.append(prob[tokens])
    y, p = np.concatenate(labels).astype(float), np.concatenate(probs).astype(float)
    share = y.mean()
    base = -(share * math.log(share) + (1 - share) * math.log(1 - share))
    eps = 1e-7
    loss = -np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
    ranks = np.argsort(np.argsort(p)) + 1.0  # AUC = P(score of a replaced > an original)
    positives = y.sum()
    auc = ((ranks[y == 1].sum() - positives * (positives + 1) / 2)
           / (positives * (len(y) - positives)))
    print(f"held out ({len(y)} tokens): replaced share {share:.3f}, base-rate loss H(p) "
          f"{base:.3f}; discriminator loss {loss:.3f}, AUC {auc:.3f}, mean p(replaced) "
          f"{p[y == 1].mean():.3f} on replaced vs {p[y == 0].mean():.3f} on original tokens")
    return loss, base, auc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objective", choices=tuple(DEFAULTS), required=True)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--teacher-steps", type=int, default=200,
                        help="distil: steps fine-tuning the MiniLM teacher as a MaskedLM")
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--initializer-range", type=float, default=None,
                        help="stddev of the initial weights of the models trained from scratch")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for key, value in DEFAULTS[args.objective].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    keras.utils.set_random_seed(args.seed)
    start = time.time()

    common = dict(sequence_length=args.sequence_length, batch_size=args.batch_size,
                  seed=args.seed)
    documents = corpus.default_corpus()
    held_out = documents.take(HELD_OUT).batch(args.batch_size)
    train = documents.skip(HELD_OUT).shuffle(4096, seed=args.seed).repeat().batch(args.batch_size)

    if args.objective == "distil":
        # Teacher: the real pretrained MiniLM (6 x 384). It ships no MLM head (it was tuned for
        # sentence embeddings), so it is first fine-tuned as a MaskedLM on the corpus: a fresh
        # head tied to its token table.
        tokenizer = kb.presets.load_tokenizer("all_minilm_l6_v2")
        teacher_backbone = kb.models.BertBackbone.from_preset("all_minilm_l6_v2")
        pre = kb.tasks.MaskedLM.default_preprocessor(tokenizer, teacher_backbone, **common)
        teacher = kb.tasks.MaskedLM(teacher_backbone, preprocessor=pre)
        print(f"teacher: MiniLM as a MaskedLM ({args.teacher_steps} steps):")
        run(teacher, train, args, ["mlm_loss", "mlm_accuracy"], steps=args.teacher_steps,
            learning_rate=5e-4)
        # Student: DistilBERT's recipe, every other teacher layer (3 of 6) + the embeddings.
        student = student_from_teacher(teacher_backbone, layers=(0, 2, 4))
        # KL on the masked slots only (an option of DistilBERT's code): the full-vocabulary
        # softmax at every token of both models would dominate the CPU time.
        task = kb.tasks.Distiller(teacher, student, restrict_ce_to_mask=True, preprocessor=pre)
        print(f"student (Distiller, {student.num_params():,} parameters):")
        h = run(task, train, args, ["ce_loss", "mlm_loss", "cos_loss", "mlm_accuracy", "loss"])
        print(f"total time {time.time() - start:.0f}s")
        assert h["loss"][-1] < 0.9 * h["loss"][0], "the distillation loss did not fall clearly"
        return

    tokenizer = kb.presets.load_tokenizer("bert_tiny_en_uncased")
    size = dict(vocabulary_size=tokenizer.vocabulary_size(), num_layers=4, num_heads=2,
                hidden_dim=128, intermediate_dim=512, max_sequence_length=args.sequence_length,
                initializer_range=args.initializer_range)
    if args.objective == "electra":
        disc = kb.models.ElectraBackbone(embedding_dim=64, **size)
        pre = kb.tasks.ElectraPretrainer.default_preprocessor(tokenizer, disc, **common)
        task = kb.tasks.ElectraPretrainer(discriminator=disc, preprocessor=pre, seed=args.seed)
        h = run(task, train, args, ["mlm_loss", "rtd_loss", "rtd_accuracy", "loss"])
        loss, base, auc = electra_held_out(task, held_out)
        print(f"total time {time.time() - start:.0f}s")
        assert loss < base and auc > 0.5, "the discriminator did not beat the base rate"
    else:
        texts = corpus.default_corpus().shuffle(4096, seed=args.seed).repeat().batch(
            args.batch_size)
        backbone = kb.models.SpanBertBackbone(**size)
        pre = kb.tasks.SpanBertPretrainer.default_preprocessor(tokenizer, backbone, **common)
        task = kb.tasks.SpanBertPretrainer(backbone, preprocessor=pre)
        h = run(task, texts, args, ["mlm_loss", "sbo_loss", "mlm_accuracy", "loss"])
        print(f"total time {time.time() - start:.0f}s")
        assert h["loss"][-1] < h["loss"][0], "the loss did not fall"


if __name__ == "__main__":
    main()
