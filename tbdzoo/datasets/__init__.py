"""Data for training steps: synthetic batches, Deep Speech 2's front-end, ImageNet's folder
layout for image classification, Pascal VOC 2007 for detection (a reader, a writer and Faster
R-CNN's batches), parallel text with subword vocabularies, and LibriSpeech. NumPy out."""
from . import detection_batch, imagenet, synthetic, voc
from .detection_batch import check_detection_batch, iterate_batches, synthetic_detection_batch, synthetic_image
from .errors import DatasetError
from .imagenet import ImageNetFolder
from .librispeech import LibriSpeech
from .parallel_text import ParallelText
from .source import ExampleSource
from .voc import CLASSES as VOC_CLASSES
from .voc import VOCDetection, write_voc

__all__ = ["synthetic", "voc", "detection_batch", "DatasetError", "VOCDetection", "VOC_CLASSES",
           "write_voc", "synthetic_image", "synthetic_detection_batch", "iterate_batches",
           "check_detection_batch", "ParallelText", "LibriSpeech", "imagenet", "ImageNetFolder",
           "ExampleSource"]
