"""The held-out metrics the models' cards name (``Training(metrics=...)``): each one's range,
direction and what it measures. Models that share a task share its metrics."""
from .card import Metric

__all__ = ["TOP1", "RETURN", "TOKENS", "SENTENCES", "EXACT", "BLEU", "CER", "WER", "MAP",
           "FRECHET"]

TOP1 = Metric("top1", 0.0, 1.0, True, "top-1 accuracy on the held-out split (val/)")
# CartPole-v1's episodes end at 500 steps, one reward a step.
RETURN = Metric("return", 0.0, 500.0, True,
                "mean return of the last 100 finished training episodes (train_a2c's window)")

TOKENS = Metric("token_accuracy", 0.0, 1.0, True,
                "teacher-forced next-word accuracy on the held-out split (tst2013)")
SENTENCES = Metric("sentence_accuracy", 0.0, 1.0, True,
                   "fraction of held-out sentences with every word right, teacher-forced")
EXACT = Metric("exact_match", 0.0, 1.0, True,
               "fraction of held-out sentences that greedy decoding writes word for word")
BLEU = Metric("bleu", 0.0, 100.0, True,
              "corpus BLEU (0-100, sacrebleu on the data set's words) of greedy decoding on "
              "the held-out split")

CER = Metric("cer", 0.0, 1.0, False, "character error rate of greedy CTC decoding on the "
             "held-out voices (test-clean); lower is better")
WER = Metric("wer", 0.0, 1.0, False, "word error rate of the same decoding; lower is better")

MAP = Metric("map", 0.0, 1.0, True, "PASCAL VOC2007 mAP (11-point AP at IoU 0.5, difficult "
             "objects ignored) of the detections on the held-out images (ImageSets/Main/test)")
FRECHET = Metric("frechet", 0.0, 1000.0, False,
                 "Frechet distance of 500 generated images from the held-out images, on a "
                 "frozen classifier's features (valid_64x64/; training/frechet.py); lower is "
                 "better")
