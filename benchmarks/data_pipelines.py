"""Images per second of each framework's input pipeline on this CPU, without a model.

    .venv/bin/python -m benchmarks.data_pipelines      # benchmarks/results/data_pipelines_cpu.json

Writes a folder of ImageNet-sized JPEGs (500 x 375 and 375 x 500, quality 90, photographic
noise so the decoder has real work), then for each pipeline (NumPy feed, PyTorch DataLoader,
tf.data, Gluon DataLoader), with augmentation (random-resized crop + flip to 224) and without
(resize to 256 + centre crop 224), and 0, 1 and 2 workers, reads ``--batches`` batches of 32
after one untimed batch (worker start-up and the first decode excluded) and reports images/s,
the best of ``--rounds`` rounds. Each framework runs in its own process, so no framework's
threads slow another's. The machine's load average is recorded beside the figures: on a
shared machine they are lower bounds.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORKS = ("numpy", "torch", "tensorflow", "mxnet")


def make_images(root, count, seed=0):
    import numpy as np
    from PIL import Image
    rng = np.random.RandomState(seed)
    for i in range(count):
        synset = "n{:08d}".format(1440764 + i % 4)
        folder = os.path.join(root, "train", synset)
        os.makedirs(folder, exist_ok=True)
        h, w = (375, 500) if i % 2 else (500, 375)
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255.0 / w, y * 255.0 / h, (x + y) * 127.0 / (w + h)], -1)
        image = np.clip(base + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(image).save(os.path.join(folder, "{}_{}.JPEG".format(synset, i)),
                                    quality=90)
    return root


def measure(framework, root, batches, rounds, batch_size):
    from tbdzoo.datasets import ImageNetFolder
    from tbdzoo.pipelines import AugmentSpec, for_backend
    module = for_backend(framework)
    source = ImageNetFolder(root)
    rows = []
    for augment in (True, False):
        for workers in (0, 1, 2):
            best = 0.0
            for r in range(rounds):
                it = module.loader(source, AugmentSpec(224, train=augment), batch_size, seed=r,
                                   epochs=None, workers=workers, prefetch=2)
                next(it)
                start = time.perf_counter()
                for _ in range(batches):
                    next(it)
                best = max(best, batches * batch_size / (time.perf_counter() - start))
                if hasattr(it, "close"):
                    it.close()
                del it
            rows.append({"pipeline": module.NAME, "framework": framework, "augment": augment,
                         "workers": workers, "images_per_s": round(best, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--dir", default="/tmp/tbdzoo-pipeline-bench")
    p.add_argument("--framework", help=argparse.SUPPRESS)  # one framework, in a child process
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                 "data_pipelines_cpu.json"))
    args = p.parse_args()
    if args.framework:
        rows = measure(args.framework, args.dir, args.batches, args.rounds, args.batch_size)
        print("ROWS " + json.dumps(rows))
        return
    if not os.path.isdir(os.path.join(args.dir, "train")):
        make_images(args.dir, args.images)
    rows, load = [], []
    for framework in args.frameworks.split(","):
        load.append(os.getloadavg()[0])
        out = subprocess.run([sys.executable, "-m", "benchmarks.data_pipelines", "--framework",
                              framework, "--dir", args.dir, "--batches", str(args.batches),
                              "--rounds", str(args.rounds), "--batch-size", str(args.batch_size)],
                             stdout=subprocess.PIPE, text=True, check=True,
                             cwd=ROOT).stdout
        rows += json.loads(out.split("ROWS ", 1)[1])
    load.append(os.getloadavg()[0])
    result = {"machine": {"cpu_count": os.cpu_count(), "load_average_1min": load},
              "images": args.images, "image_sizes": "500x375 and 375x500, JPEG quality 90",
              "batch_size": args.batch_size, "timed_batches": args.batches, "rounds": args.rounds,
              "output": "224 x 224, float32 NCHW, normalised", "results": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("written to", args.out)


if __name__ == "__main__":
    main()
