"""One keras.Model subclass per pretraining objective and per downstream task."""
from keras_bertfam.tasks.bert_pretrainer import BertPretrainer
from keras_bertfam.tasks.masked_lm import MaskedLM
from keras_bertfam.tasks.task import Task, WarmupLinearDecay
from keras_bertfam.tasks.albert_pretrainer import AlbertPretrainer
