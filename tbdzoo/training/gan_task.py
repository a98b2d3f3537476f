"""WGAN on 64 x 64 images in the downsampled-ImageNet layout (fashion-mnist-64 from
`tbd data make`): real images from DIR/train_64x64/ PNGs scaled to [-1, 1] as the model reads
them, the noise and penalty weights of every update drawn from (seed, step), and the metric
``frechet``: the Fréchet distance (frechet.py) between the features of EVAL_IMAGES images the
generator makes from a fixed noise and those of the held-out PNGs (DIR/valid_64x64/). The
feature network is trained on the labelled copy of the training split
(DIR/Imagenet64_train_npz/). Generation runs through ``model.predict`` and the distance in
NumPy and SciPy, so a backend enters the metric only through the generated pixels."""
import os

import numpy as np

from ..datasets.errors import DatasetError
from ..datasets.imagenet64 import NPZ_FOLDERS, PNG_FOLDERS, PNGFolder, read_npz_folder
from .errors import TrainingError
from .frechet import FeatureNetwork, frechet_distance
from .image_task import dataset_name

__all__ = ["GanTask", "LAYOUT", "DATA_COMMAND", "EVAL_IMAGES", "EVAL_NOISE_SEED", "open_gan_data",
           "scale"]

LAYOUT = ("downsampled-ImageNet layout: DIR/train_64x64/*.png, DIR/valid_64x64/*.png and the "
          "labelled training copy DIR/Imagenet64_train_npz/train_data_batch_<k>.npz")
# The command that writes the proxy's data in this layout.
DATA_COMMAND = ("tbd data make fashion-mnist-64 --out DIR "
                "--set train_per_class=200 --set val_per_class=50")
EVAL_IMAGES = 500       # generated images an evaluation scores
EVAL_BATCH = 100        # the generator's BatchNorm normalises by this batch
EVAL_NOISE_SEED = 2017  # the same noise for every run, seed and backend


def scale(pixels):
    """(N, S, S, 3) uint8 to WGAN's (N, 3, S, S) float32 in [-1, 1]: 2 (x / 255 - 0.5)."""
    return (2.0 * (np.asarray(pixels, np.float32).transpose(0, 3, 1, 2) / 255.0 - 0.5)) \
        .astype(np.float32)


def open_gan_data(data_dir):
    """(training PNGs, held-out PNGs, the labelled npz folder), or an error naming the layout
    and the command that makes one."""
    if not os.path.isdir(data_dir or ""):
        raise TrainingError("{}: no such folder; WGAN trains from a folder in {}; make one "
                            "with: {}".format(data_dir, LAYOUT, DATA_COMMAND))
    npz = os.path.join(data_dir, NPZ_FOLDERS["train"])
    try:
        train = PNGFolder(os.path.join(data_dir, PNG_FOLDERS["train"]))
        valid = PNGFolder(os.path.join(data_dir, PNG_FOLDERS["valid"]))
        if not os.path.isdir(npz):
            raise DatasetError("{}: no such folder (the feature network's labels)".format(npz))
    except DatasetError as e:
        raise TrainingError("{}: not a data set WGAN trains from ({}); expected {}; make one "
                            "with: {}".format(data_dir, e, LAYOUT, DATA_COMMAND)) from e
    return train, valid, npz


class GanTask:
    metric_names = ("frechet",)

    layout, data_command = LAYOUT, DATA_COMMAND   # what a missing --data is told

    @staticmethod
    def check_data(data_dir):
        """Open the folder, so that a wrong layout fails before a model is built."""
        open_gan_data(data_dir)

    def __init__(self, model, data_dir, seed=0, workers=0, rank=0, world_size=1):
        if world_size > 1:
            raise TrainingError("wgan has no data-parallel training task yet: drop --nproc")
        self.model, self.seed, self.hp = model, seed, model.hparams
        train, valid, npz = open_gan_data(data_dir)
        try:
            self.train = train.array()          # uint8, scaled a batch at a time
            held_out = scale(valid.array())
            images, labels = read_npz_folder(npz, size=64)
        except DatasetError as e:
            raise TrainingError("{}: {}; remake it with: {}".format(data_dir, e, DATA_COMMAND)) from e
        if len(self.train) < self.hp["batch_size"]:
            raise TrainingError("{}: {} training images; a batch needs {}".format(
                data_dir, len(self.train), self.hp["batch_size"]))
        self.features = FeatureNetwork().fit(scale(images), labels)
        self.held_out_features = self.features.features(held_out)
        self.noise = np.random.RandomState(EVAL_NOISE_SEED).standard_normal(
            (EVAL_IMAGES, self.hp["z_dim"])).astype(np.float32)
        self.pipeline = ("PNGs decoded once, NumPy batches; noise and penalty weights of "
                         "(seed, step)")
        self.dataset = dataset_name(data_dir)
        self.examples = {"train": len(self.train), "valid": len(held_out),
                         "generated": EVAL_IMAGES}

    def held_out(self):
        return self.held_out_features

    def _real(self):
        """Training images without end, each epoch a permutation of (seed, epoch)."""
        epoch = 0
        while True:
            yield from np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
            epoch += 1

    def batches(self):
        """One step's batch: n_critic batches of real images (one per critic update), the
        noise of the generator update and of each critic update, and (WGAN-GP) the
        interpolation weights of each critic update, stacked as the program reads them."""
        size = self.hp["batch_size"]
        critics, step, order = self.hp["n_critic"], 0, self._real()
        while True:
            rows = [next(order) for _ in range(critics * size)]
            rng = np.random.default_rng([self.seed, step, 1])
            batch = {"real": scale(self.train[rows]),
                     "noise": rng.standard_normal(((1 + critics) * size, self.hp["z_dim"]))
                     .astype(np.float32)}
            if self.hp["mode"] == "wgan-gp":
                batch["alpha"] = rng.uniform(0.0, 1.0, (critics * size, 1)).astype(np.float32)
            yield batch
            step += 1

    def close(self):
        pass

    def generate(self):
        """EVAL_IMAGES images from the fixed noise, EVAL_BATCH at a time: (N, 3, 64, 64)."""
        return np.concatenate([
            np.asarray(self.model.predict({"noise": self.noise[i:i + EVAL_BATCH]}), np.float32)
            for i in range(0, EVAL_IMAGES, EVAL_BATCH)])

    def evaluate(self, metrics=None):
        """{"frechet": the distance of the generated images' features from the held-out
        images'}; there is one metric, so ``metrics`` changes nothing."""
        generated = self.features.features(self.generate())
        return {"frechet": frechet_distance(generated, self.held_out_features)}
