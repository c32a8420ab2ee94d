"""One keras.Model subclass per pretraining objective and per downstream task."""
from keras_bertfam.tasks.albert_pretrainer import AlbertPretrainer
from keras_bertfam.tasks.bert_pretrainer import BertPretrainer
from keras_bertfam.tasks.classifier import TextClassifier
from keras_bertfam.tasks.distiller import Distiller, student_from_teacher
from keras_bertfam.tasks.electra_pretrainer import ElectraPretrainer
from keras_bertfam.tasks.masked_lm import MaskedLM
from keras_bertfam.tasks.multiple_choice import MultipleChoice
from keras_bertfam.tasks.question_answerer import QuestionAnswerer
from keras_bertfam.tasks.sentence_encoder import SentenceEncoder
from keras_bertfam.tasks.spanbert_pretrainer import SpanBertPretrainer
from keras_bertfam.tasks.optimization import AdamW, WarmupLinearDecay
from keras_bertfam.tasks.task import Task
from keras_bertfam.tasks.token_classifier import TokenClassifier
from keras_bertfam.tasks.xlnet_pretrainer import XLNetPretrainer
