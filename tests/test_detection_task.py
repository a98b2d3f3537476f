"""Faster R-CNN's task (tbdzoo/training/detection_task.py): its proxy trains from a voc-composed
folder, the held-out score is VOC07 mAP of ``predict``'s detections mapped back to the images'
own pixels (1 for the annotations themselves, 0 for nothing), two backends score the same
weights alike, and a folder that is not VOC's layout is refused with the command that makes one."""
import os
import shutil

import numpy as np
import pytest

from conftest import require_backend
from tbdzoo.datasets.makers import make
from tbdzoo.training import TrainingError, train_to_target
from tbdzoo.training.detection_task import DetectionTask
from tbdzoo.training.loop import build_proxy, task_check
from tbdzoo.training.targets import parse_target

# 8 train, 4 val, 4 test images of 96 x 128, one or two garments of 48 to 67 pixels each
SMALL_VOC = {"images": 16, "long_side": 128, "min_side": 48, "max_objects": 2}
# a 128-pixel canvas: the task resizes the 96 x 128 images to 77 x 102, so scores must undo it
RESIZED = {"canvas": (128, 128)}


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("detection") / "voc")
    make("voc-composed", out, seed=0, options=SMALL_VOC)
    return out


@pytest.fixture(scope="module")
def model(one_torch_thread):
    net = build_proxy("faster_rcnn", "torch", 0, RESIZED)
    yield net
    net.close()


class Oracle:
    """Stands in for the model's ``predict``: each held-out image's annotated objects (those
    marked difficult included), score 1, or nothing at all."""

    def __init__(self, task, empty=False):
        self.task, self.empty, self.hparams = task, empty, task.model.hparams

    def predict(self, inputs):
        batch = next(b for b in self.task.held_out() if b["images"] is inputs["images"])
        counts = np.zeros_like(batch["gt_count"]) if self.empty else batch["gt_count"]
        return {"boxes": batch["gt_boxes"], "labels": batch["gt_labels"],
                "scores": (batch["gt_labels"] > 0).astype(np.float32), "counts": counts}


def test_a_few_steps_train_and_evaluate_on_torch(voc, one_torch_thread):
    result = train_to_target("faster_rcnn", "torch", voc, "map=0.99", seed=0, max_steps=4,
                             eval_every=2)
    record = result.record()
    assert record["steps_run"] == 4 and not record["reached"]
    assert [h["step"] for h in record["history"]] == [2, 4]
    assert all(0.0 <= h["value"] <= 1.0 for h in record["history"])
    assert len(record["losses"]) == 4 and np.isfinite(record["losses"]).all()
    assert record["examples"]["test"] == 4 and record["examples"]["train"] >= 1
    assert record["dataset"].startswith("voc-composed")
    assert record["config"] == "proxy of tiny"


def test_perfect_detections_score_1_and_none_0_through_the_resize(voc, model):
    task = DetectionTask(model, voc)
    batch = task.held_out()[0]
    assert (batch["image_hw"] != batch["original_hw"]).any()     # the mapping back is tested
    task.model = Oracle(task)
    assert task.evaluate() == {"map": pytest.approx(1.0)}
    task.model = Oracle(task, empty=True)
    assert task.evaluate() == {"map": 0.0}


def test_torch_and_mxnet_score_the_same_weights_alike(voc, model):
    """After 3 steps the annotations are not found yet (mAP 0 on both), so each backend is also
    scored against PyTorch's own detections as the ground truth: PyTorch's give 1 exactly (NMS
    per class leaves no two of a class overlapping by more than 0.5), MXNet's the same only if
    it finds the same boxes of the same classes in the same score order."""
    require_backend("mxnet")
    task = DetectionTask(model, voc)
    batches = task.batches()
    for _ in range(3):
        model.train_step(next(batches))
    other = build_proxy("faster_rcnn", "mxnet", 0, RESIZED)
    try:
        other.set_weights(model.get_weights())
        theirs_task = DetectionTask(other, voc)
        assert theirs_task.evaluate() == pytest.approx(task.evaluate(), abs=1e-6)
        mine, theirs = task.detections(), theirs_task.detections()
        assert sum(len(d[0]) for d in mine) > 0
        for scored in (task, theirs_task):
            scored._truth = [(boxes, labels) for boxes, _, labels in mine]
        assert task.evaluate() == {"map": 1.0}
        assert theirs_task.evaluate() == {"map": pytest.approx(1.0, abs=1e-6)}
    finally:
        other.close()
    for (boxes, scores, labels), (b2, s2, l2) in zip(mine, theirs):
        np.testing.assert_array_equal(labels, l2)
        np.testing.assert_allclose(scores, s2, atol=1e-4)
        np.testing.assert_allclose(boxes, b2, atol=1e-2)


def test_a_folder_not_in_voc_layout_is_refused_with_the_make_command(voc, tmp_path):
    imagenet = tmp_path / "fm32"
    (imagenet / "train" / "n00000000").mkdir(parents=True)
    with pytest.raises(TrainingError, match=r"no Annotations/.*expected VOC 2007 layout.*"
                                            r"tbd data make voc-composed --out DIR"):
        task_check("faster_rcnn", str(imagenet))
    no_test = str(tmp_path / "no-test")
    shutil.copytree(voc, no_test)
    os.remove(os.path.join(no_test, "VOC2007", "ImageSets", "Main", "test.txt"))
    with pytest.raises(TrainingError, match=r"test\.txt: no such image set file.*"
                                            r"tbd data make voc-composed"):
        train_to_target("faster_rcnn", "torch", no_test, "map=0.5", max_steps=1)
    with pytest.raises(TrainingError, match=r"top1 is not a metric of faster_rcnn; its "
                                            r"metrics: map \(PASCAL VOC2007 mAP"):
        parse_target("faster_rcnn", "top1=0.5")
