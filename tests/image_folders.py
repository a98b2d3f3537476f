"""Tiny ImageNet-layout folders of real JPEGs, written with Pillow, for the reader's and the
input pipelines' tests. Each image is a smooth gradient plus its class's colour, so decoders
and resizers give nearly the same pixels and a bug in a crop or a flip shows."""
import os

import numpy as np

SYNSETS = ("n01440764", "n01443537", "n01484850")


def gradient_image(rng, height, width, label):
    y = np.linspace(0, 1, height)[:, None, None]
    x = np.linspace(0, 1, width)[None, :, None]
    colour = np.array([[(60, 120, 200), (200, 80, 40), (90, 200, 90)][label % 3]], np.float64)
    base = 40 + 120 * x * np.array([1.0, 0.3, 0.6]) + 80 * y * np.array([0.2, 1.0, 0.5])
    offset = rng.uniform(-20, 20, size=3)
    return np.clip(0.5 * base + 0.5 * colour + offset, 0, 255).astype(np.uint8)


def write_jpeg(path, image, quality=92):
    from PIL import Image
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(image).save(path, format="JPEG", quality=quality)


def make_folder(root, per_class=4, val_per_class=2, classes=SYNSETS, sizes=((48, 64), (64, 48),
                                                                             (56, 56), (40, 72)),
                flat_val=False, seed=0):
    """root/train/<synset>/*.JPEG and root/val (class folders, or flat with one synset a line
    in val_labels.txt); returns root."""
    rng = np.random.RandomState(seed)
    k = 0
    for label, synset in enumerate(classes):
        for i in range(per_class):
            h, w = sizes[k % len(sizes)]
            k += 1
            write_jpeg(os.path.join(root, "train", synset, "{}_{}.JPEG".format(synset, i)),
                       gradient_image(rng, h, w, label))
    names = []
    for label, synset in enumerate(classes):
        for i in range(val_per_class):
            h, w = sizes[k % len(sizes)]
            k += 1
            name = "ILSVRC2012_val_{:08d}.JPEG".format(label * val_per_class + i + 1)
            folder = os.path.join(root, "val") if flat_val else os.path.join(root, "val", synset)
            write_jpeg(os.path.join(folder, name), gradient_image(rng, h, w, label))
            names.append((name, synset))
    if flat_val:
        with open(os.path.join(root, "val", "val_labels.txt"), "w") as f:
            f.writelines(s + "\n" for _, s in sorted(names))
    return str(root)
