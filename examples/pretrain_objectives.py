"""Short real runs of the ELECTRA, SpanBERT and DistilBERT objectives on the default corpus.

IMDB reviews (the default corpus) -> BERT's uncased WordPiece tokenizer -> each task's default
preprocessor -> `fit()` on the raw strings, with tiny models trained from scratch. Prints the
losses (mean over each block of steps).

    python examples/pretrain_objectives.py --objective electra|spanbert|distil [--steps 120]

- electra: ElectraPretrainer (discriminator L4/H128/E64, generator 1/4 width), ELECTRA masking
  (15%, 85% [MASK] / 15% unchanged).
- spanbert: SpanBertPretrainer (L4/H128) on SpanBertPreprocessor (span masking + boundaries).
- distil: a 4-layer BERT teacher first trained with MaskedLM for --steps steps, then distilled
  into a 2-layer DistilBERT student (teacher layers 0 and 3) for --steps steps.

Measured runs: see RESULTS at the bottom of this docstring (TensorFlow backend, 2 CPU cores shared
with other jobs, seed 1, --steps 120 --block 20, sequence length 64, batch 16).

electra (402s; loss = mlm_loss + 50 * rtd_loss):

        steps      mlm_loss      rtd_loss  rtd_accuracy          loss
       1-20          10.073         0.514         0.822        35.764
      21-40           8.891         0.435         0.844        30.620
      41-60           7.389         0.432         0.845        28.992
      61-80           6.897         0.431         0.845        28.448
      81-100          6.836         0.431         0.845        28.392
     101-120          6.800         0.430         0.846        28.308

  The generator's MLM loss falls to about the unigram entropy; the discriminator's loss falls to
  0.43 with accuracy 0.845 = the share of tokens left original: it has learned the prior ("most
  tokens are original"), NOT yet to spot replacements, in this budget.

spanbert (348s; loss = mlm_loss + sbo_loss):

        steps      mlm_loss      sbo_loss  mlm_accuracy          loss
       1-20           9.371         9.369         0.033        18.740
      21-40           7.166         7.166         0.038        14.332
      41-60           6.955         6.957         0.047        13.912
      61-80           6.935         6.937         0.049        13.872
      81-100          6.978         6.985         0.037        13.963
     101-120          6.883         6.888         0.045        13.771

  Both heads fall together to about the unigram entropy (token frequencies); neither the span
  boundaries nor the context are exploited yet at this size and budget.

distil (995s in all; the teacher's MaskedLM run went 9.385 -> 6.898 mlm_loss over 120 steps;
then the 2-layer student, loss = 5 * ce_loss + 2 * mlm_loss + cos_loss):

        steps       ce_loss      mlm_loss      cos_loss          loss
       1-20           0.024         6.883         0.058        13.945
      21-40           0.035         6.935         0.029        14.077
      41-60           0.040         6.771         0.023        13.766
      61-80           0.040         6.858         0.022        13.939
      81-100          0.037         6.848         0.020        13.901
     101-120          0.035         6.776         0.020        13.745

  The student starts from teacher layers 0 and 3, so the KL term starts small (0.024) and
  drifts up slightly (0.035) while the cosine loss falls (0.058 -> 0.020) and the MLM loss
  falls a little (6.88 -> 6.78); the total falls only 1.4% and not monotonically. A short, weak
  signal: the teacher itself has only learned token frequencies in 120 steps.
"""
import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_bertfam as kb  # noqa: E402
from keras_bertfam.preprocessing import corpus  # noqa: E402
from keras_bertfam.tasks.distiller import student_from_teacher  # noqa: E402


def run(task, texts, args, keys):
    task.compile(learning_rate=args.learning_rate, warmup_steps=args.steps // 10,
                 total_steps=args.steps)
    history = task.fit(texts, steps_per_epoch=args.block, epochs=args.steps // args.block,
                       verbose=0).history
    print(f"{'steps':>9}  " + "  ".join(f"{k:>12}" for k in keys))
    for i in range(len(history[keys[0]])):
        print(f"{i * args.block + 1:>4}-{(i + 1) * args.block:<4}  "
              + "  ".join(f"{history[k][i]:12.3f}" for k in keys))
    return history


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objective", choices=("electra", "spanbert", "distil"),
                        required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    keras.utils.set_random_seed(args.seed)
    start = time.time()

    tokenizer = kb.presets.load_tokenizer("bert_tiny_en_uncased")
    texts = corpus.default_corpus().shuffle(4096, seed=args.seed).repeat().batch(
        args.batch_size)
    size = dict(vocabulary_size=tokenizer.vocabulary_size(), num_layers=4, num_heads=2,
                hidden_dim=128, intermediate_dim=512, max_sequence_length=args.sequence_length)
    common = dict(sequence_length=args.sequence_length, batch_size=args.batch_size,
                  seed=args.seed)

    if args.objective == "electra":
        disc = kb.models.ElectraBackbone(embedding_dim=64, **size)
        pre = kb.tasks.ElectraPretrainer.default_preprocessor(tokenizer, disc, **common)
        task = kb.tasks.ElectraPretrainer(discriminator=disc, preprocessor=pre, seed=args.seed)
        h = run(task, texts, args, ["mlm_loss", "rtd_loss", "rtd_accuracy", "loss"])
    elif args.objective == "spanbert":
        backbone = kb.models.SpanBertBackbone(**size)
        pre = kb.tasks.SpanBertPretrainer.default_preprocessor(tokenizer, backbone, **common)
        task = kb.tasks.SpanBertPretrainer(backbone, preprocessor=pre)
        h = run(task, texts, args, ["mlm_loss", "sbo_loss", "mlm_accuracy", "loss"])
    else:
        teacher_backbone = kb.models.BertBackbone(**size)
        pre = kb.tasks.MaskedLM.default_preprocessor(tokenizer, teacher_backbone, **common)
        teacher = kb.tasks.MaskedLM(teacher_backbone, preprocessor=pre)
        print("teacher (MaskedLM):")
        run(teacher, texts, args, ["mlm_loss", "mlm_accuracy"])
        student = student_from_teacher(teacher_backbone, layers=(0, 3))
        task = kb.tasks.Distiller(teacher, student, preprocessor=pre)
        print("student (Distiller):")
        h = run(task, texts, args, ["ce_loss", "mlm_loss", "cos_loss", "loss"])
    print(f"total time {time.time() - start:.0f}s")
    assert h["loss"][-1] < h["loss"][0], "the loss did not fall"


if __name__ == "__main__":
    main()
