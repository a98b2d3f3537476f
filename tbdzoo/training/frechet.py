"""A Fréchet distance between image sets, measured offline (WGAN's metric, gan_task.py).

The Fréchet Inception Distance (FID) fits a Gaussian to the features a pretrained Inception-v3
gives each image and takes the Fréchet distance between the fits of generated and real images.
No pretrained network can be downloaded here, so the features come from a network trained on
the data set itself: scikit-learn's ``MLPClassifier``, one hidden layer of 64 ReLU units, fit to
the training split's labels with a fixed ``random_state`` on the images made 16 x 16 grey
(a 4 x 4 mean of each pixel block). It trains in seconds, the same weights every time, and its
hidden layer has learnt what tells the garments apart, which is what a generated image must get
right. The distance is on that layer's activations; its values are not comparable with a
published FID (reports/2026-12-time-to-accuracy.md, "Measured: WGAN").
"""
import warnings

import numpy as np

__all__ = ["FEATURES", "GRID", "grey_grid", "FeatureNetwork", "gaussian", "frechet_distance"]

FEATURES = 64       # hidden units: the features' dimension
GRID = 16           # the classifier's input: GRID x GRID grey levels in [0, 1]
MAX_ITER = 200
RANDOM_STATE = 0


def grey_grid(images):
    """(N, 3, S, S) images in [-1, 1], as WGAN reads and writes them, to (N, GRID * GRID) grey
    levels in [0, 1]: the channels' mean, then the mean of each (S / GRID)-pixel block."""
    x = np.asarray(images, np.float64)
    if x.ndim != 4 or x.shape[1] != 3 or x.shape[2] != x.shape[3] or x.shape[2] % GRID:
        raise ValueError("images of shape {}: expected (N, 3, S, S) with S a multiple of "
                         "{}".format(x.shape, GRID))
    grey = (x.mean(axis=1) + 1.0) / 2.0
    block = x.shape[2] // GRID
    grid = grey.reshape(len(x), GRID, block, GRID, block).mean(axis=(2, 4))
    return np.clip(grid, 0.0, 1.0).reshape(len(x), GRID * GRID)


class FeatureNetwork:
    """The frozen feature network: ``fit`` once on labelled training images, then
    ``features(images)`` is the hidden layer's ReLU activations, (N, FEATURES) float64."""

    def __init__(self, random_state=RANDOM_STATE):
        self.random_state = random_state
        self.classifier = None

    def fit(self, images, labels):
        """Train on (N, 3, S, S) images in [-1, 1] and their integer labels; returns self."""
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier
        classifier = MLPClassifier(hidden_layer_sizes=(FEATURES,), activation="relu",
                                   max_iter=MAX_ITER, random_state=self.random_state)
        with warnings.catch_warnings():
            # The features need a useful hidden layer, not a converged loss.
            warnings.simplefilter("ignore", ConvergenceWarning)
            classifier.fit(grey_grid(images), np.asarray(labels))
        self.classifier = classifier
        return self

    def accuracy(self, images, labels):
        """The classifier's accuracy: evidence that its hidden layer separates the classes."""
        return float(self.classifier.score(grey_grid(images), np.asarray(labels)))

    def features(self, images):
        if self.classifier is None:
            raise RuntimeError("the feature network is not trained: call fit first")
        hidden = grey_grid(images) @ self.classifier.coefs_[0] + self.classifier.intercepts_[0]
        return np.maximum(hidden, 0.0)


def gaussian(features):
    """(mean, covariance) of (N, D) features, N > 1."""
    x = np.asarray(features, np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError("features of shape {}: need (N, D) with N of at least 2".format(x.shape))
    return x.mean(axis=0), np.cov(x, rowvar=False)


def frechet_distance(a, b, eps=1e-6):
    """The Fréchet distance between Gaussian fits of feature sets ``a`` and ``b`` (N, D):
    |mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)), the matrix square root's real part
    (rounding leaves tiny imaginary parts). A singular product (features that never fire)
    gets ``eps`` on both diagonals before the root."""
    from scipy import linalg
    mu_a, s_a = gaussian(a)
    mu_b, s_b = gaussian(b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", linalg.LinAlgWarning)   # singular: handled below
        root = linalg.sqrtm(s_a @ s_b)
        if not np.isfinite(root).all():
            shift = np.eye(len(s_a)) * eps
            root = linalg.sqrtm((s_a + shift) @ (s_b + shift))
    root = np.real(root)
    diff = mu_a - mu_b
    return float(max(diff @ diff + np.trace(s_a) + np.trace(s_b) - 2.0 * np.trace(root), 0.0))
