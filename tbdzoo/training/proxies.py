"""Proxy configs: the paper config with overrides that make a model converge in a few minutes
on a 2-core CPU, on the data sets `tbd data make` writes. Each keeps the model's optimizer and
schedule and shrinks only its size (docs/training.md gives the measured steps and minutes).

    tbd data make fashion-mnist-imagenet --out data/fm32 --set size=32 \\
        --set train_per_class=200 --set val_per_class=50
"""
from .errors import TrainingError

__all__ = ["PROXIES", "proxy_overrides", "DATA_COMMAND"]

DATA_COMMAND = {
    "image_classification": "tbd data make fashion-mnist-imagenet --out DIR --set size=32 "
                            "--set train_per_class=200 --set val_per_class=50",
    "translation": "tbd data make numbers-en-vi --out DIR",
    "speech": "tbd data make spoken-numbers --out DIR --set utterances=16",
    "detection": "tbd data make voc-composed --out DIR --set images=1000 --set long_side=128 "
                 "--set min_side=48 --set max_objects=2",
    "gan": "tbd data make fashion-mnist-64 --out DIR --set train_per_class=200 "
           "--set val_per_class=50",
}

PROXIES = {
    # One bottleneck block a stage, 8 channels wide, 32 pixels, ten classes; SGD with momentum
    # at the paper's lr 0.1. train_examples sets steps_per_epoch from the data set's size, so
    # the step schedule's milestones (epochs 30, 60, 80) stay far beyond the target.
    "resnet50": {"image_size": 32, "num_classes": 10, "blocks": (1, 1, 1, 1), "width": 8,
                 "batch_size": 32, "train_examples": 2000},
    # Every layer of the paper at 75 pixels, the smallest input without the auxiliary head
    # (which needs 299: docs/models.md), each channel count divided by 16; RMSProp as in the paper.
    "inception_v3": {"image_size": 75, "num_classes": 10, "width_divisor": 16, "aux_head": False,
                     "batch_size": 16, "train_examples": 2000},
    # The cartpole config as it is: an MLP, 16 synchronous learners.
    "a3c": {},
    # numbers-en-vi's word vocabularies (107 English and 20 Vietnamese lines, plus the special
    # ids), sentences of up to 10 + 11 words, layers 2 + 2 as in the paper but 64 units wide;
    # Adam at 3e-3 instead of 3e-4, so the proxy learns in a few hundred steps.
    "seq2seq": {"src_vocab": 110, "tgt_vocab": 24, "embed_dim": 32, "units": 64,
                "attention_units": 32, "attention_layer": 64, "src_len": 12, "tgt_len": 14,
                "batch_size": 32, "lr": 3e-3},
    # The same data in one shared vocabulary (4 special ids, then the English and the
    # Vietnamese words); 2 + 2 layers of d_model 64, 4 heads; the paper's inverse-square-root
    # schedule (lr 1.0 x d_model^-0.5) with 100 warm-up steps instead of 4,000.
    "transformer": {"vocab": 128, "d_model": 64, "heads": 4, "ffn": 128, "encoder_layers": 2,
                    "decoder_layers": 2, "src_len": 12, "tgt_len": 14, "batch_size": 32,
                    "warmup_steps": 100},
    # The paper's two convolutions with 8 channels, 2 bidirectional GRU layers of 64 (not 7 of
    # 1,760), utterances of up to 4 s (400 frames); SGD with momentum at the paper's 3e-4.
    "deepspeech2": {"channels": 8, "rnn_layers": 2, "rnn_units": 64, "fc_units": 64,
                    "batch_size": 16, "max_frames": 400},
    # The tiny config (one bottleneck a stage) 16 channels wide on a 160-pixel canvas, which
    # holds voc-composed's 96 x 128 images unresized (the task's resize is the paper's 600 /
    # 1,000 scaled to the canvas), anchors of 48 and 64 for its 48- to 67-pixel garments (at
    # most 2 an image), the 10 garment classes and the background, 32 RoIs an image; SGD with
    # momentum at tiny's lr 1e-2, ten times the paper's 1e-3 (the backbone learns from
    # scratch, not from ImageNet's weights). train_examples: voc-composed's 750 trainval
    # images, so the step schedule's x0.1 at epoch 7 of 10 (step 2,625) keeps its meaning.
    "faster_rcnn": {"canvas": (160, 160), "max_boxes": 2, "num_classes": 11, "width": 16,
                    "anchor_sizes": (48, 64), "rpn_batch": 64, "train_pre_nms": 600,
                    "train_post_nms": 128, "test_pre_nms": 600, "test_post_nms": 32,
                    "rois_per_image": 32, "detections_per_image": 20, "batch_size": 2,
                    "train_examples": 750},
    # WGAN-GP's residual generator and critic at 64 x 64 with every layer 16 times narrower
    # (dim 4), batch 16; the paper's Adam (betas 0 and 0.9) and five critic updates a step,
    # at lr 1e-3: at the paper's 1e-4 a seed in three reached no target within 6 minutes on
    # any backend (docs/training.md, "Measured: WGAN").
    "wgan": {"dim": 4, "batch_size": 16, "lr": 1e-3},
}

# The config a proxy builds on, per model.
BASE_CONFIG = {"resnet50": "paper", "inception_v3": "paper", "a3c": "cartpole",
               "seq2seq": "paper", "transformer": "paper", "deepspeech2": "paper",
               "faster_rcnn": "tiny", "wgan": "paper"}

# The target and evaluation interval `tbd train` and the benchmark use when none is given.
DEFAULTS = {
    "resnet50": {"target": "top1=0.65", "eval_every": 20},
    "inception_v3": {"target": "top1=0.5", "eval_every": 20},
    "a3c": {"target": "return=475", "eval_every": 10},
    "seq2seq": {"target": "token_accuracy=0.5", "eval_every": 25},
    "transformer": {"target": "token_accuracy=0.5", "eval_every": 25},
    "deepspeech2": {"target": "cer=0.7", "eval_every": 50},
    "faster_rcnn": {"target": "map=0.1", "eval_every": 250},
    "wgan": {"target": "frechet=30", "eval_every": 20},
}


def proxy_overrides(model_name):
    """(base config, overrides) of the model's proxy."""
    if model_name not in PROXIES:
        raise TrainingError("{} has no proxy config; proxies exist for {}".format(
            model_name, ", ".join(sorted(PROXIES))))
    return BASE_CONFIG[model_name], dict(PROXIES[model_name])
