"""Data for training steps: synthetic batches, Deep Speech 2's front-end, Pascal VOC 2007
for detection (a reader, a writer and Faster R-CNN's batches), parallel text with subword
vocabularies, and LibriSpeech. NumPy out."""
from . import detection_batch, synthetic, voc
from .detection_batch import (check_detection_batch, iterate_batches, synthetic_detection_batch,
                              synthetic_image)
from .errors import DatasetError
from .librispeech import LibriSpeech
from .parallel_text import ParallelText
from .voc import CLASSES as VOC_CLASSES, VOCDetection, write_voc

__all__ = ["synthetic", "voc", "detection_batch", "DatasetError", "VOCDetection", "VOC_CLASSES",
           "write_voc", "synthetic_image", "synthetic_detection_batch", "iterate_batches",
           "check_detection_batch", "ParallelText", "LibriSpeech"]
