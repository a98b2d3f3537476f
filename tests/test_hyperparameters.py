"""Hyperparameters are checked against one table of rules when a model is built, here and in
a worker; schedules derive their epoch length from the batch."""
import math

import pytest

import tbdzoo
from conftest import require_backend
from tbdzoo.backends.common.optimizers import NAMES, hyperparameters
from tbdzoo.errors import HyperparameterError
from tbdzoo.models.constraints import COMMON
from tbdzoo.models.probes import PROBES
from tbdzoo.profiling.memory import optimizer_slots
from tbdzoo.reference.optimizers import Optimizer as ReferenceOptimizer
from tbdzoo.schedules import learning_rate
from tbdzoo.spec.optimizers import OPTIMIZERS, state_slots
from tbdzoo.spec.program import OPTIMIZER_FIELDS

ALL_MODELS = tbdzoo.list_models() + ["probe/" + p for p in PROBES]


@pytest.mark.parametrize("name", ALL_MODELS)
def test_every_config_key_has_a_rule_that_its_value_meets(name):
    md = tbdzoo.get_model(name)
    assert md.uncovered() == []
    for config, hp in md.configs.items():
        for key, value in hp.items():
            checked = md.rules[key].check(key, value, name)
            assert checked == value and type(checked) is type(value), (config, key, value)


def test_models_share_the_common_rules():
    for name in tbdzoo.list_models():
        rules = tbdzoo.get_model(name).rules
        shared = set(rules) & set(COMMON)
        assert {"batch_size", "lr", "optimizer", "precision", "execution", "memory_format"} <= shared
        assert all(rules[k] is COMMON[k] for k in shared)


@pytest.mark.parametrize("name,overrides,message", [
    ("resnet50", {"batch_size": -3}, r"batch_size of resnet50 = -3 .*an integer >= 1"),
    ("resnet50", {"batch_size": 2.5}, r"batch_size of resnet50 = 2\.5 .*an integer >= 1"),
    ("resnet50", {"lr": "x"}, r"lr of resnet50 = 'x' .*a number > 0"),
    ("resnet50", {"lr": float("nan")}, r"lr of resnet50 = nan .*a number > 0"),
    ("resnet50", {"momentum": 1.5}, r"momentum of resnet50 = 1\.5 .*>= 0 and < 1"),
    ("resnet50", {"optimizer": "lamb"}, r"optimizer of resnet50 = 'lamb' .*one of: sgd, adam"),
    ("resnet50", {"nesterov": "yes"}, r"nesterov of resnet50 = 'yes' .*true or false"),
    ("resnet50", {"blocks": (2, 0)}, r"blocks of resnet50 = \(2, 0\) .*integers, each >= 1"),
    ("resnet50", {"lr_milestones": (60, 30)}, r"lr_milestones .*ascending"),
    ("resnet50", {"precision": "fp64"}, r"precision of resnet50 = 'fp64' .*one of: fp32, tf32, bf16"),
    ("transformer", {"dropout": 1.0}, r"dropout of transformer = 1\.0 .*>= 0 and < 1"),
    ("transformer", {"heads": 3}, r"d_model 16 is not divisible by heads 3"),
    ("transformer", {"eos_id": 50}, r"pad_id, bos_id and eos_id \(0, 1, 50\) .*below vocab 50"),
    ("wgan", {"mode": "wgan-lp"}, r"mode of wgan = 'wgan-lp' .*one of: wgan-gp, wgan"),
    ("wgan", {"gp_weight": -1.0}, r"gp_weight of wgan = -1\.0 .*>= 0"),
    ("inception_v3", {"image_size": 224},
     r"image_size 224 is too small for the auxiliary head.*set aux_head=false"),
    ("inception_v3", {"image_size": 74, "aux_head": False},
     r"image_size of inception_v3 = 74 .*>= 75"),
])
def test_bad_values_are_refused_naming_the_value_and_what_is_allowed(name, overrides, message):
    with pytest.raises(HyperparameterError, match=message):
        tbdzoo.build(name, backend="torch", config="tiny", **overrides)


def test_values_are_stored_in_the_type_the_rule_holds():
    hp = tbdzoo.get_model("resnet50").hparams("tiny", lr=1, blocks=[2, 1, 1, 1])
    assert hp["lr"] == 1.0 and isinstance(hp["lr"], float)
    assert hp["blocks"] == (2, 1, 1, 1)


@pytest.mark.parametrize("backend", ["torch", "cntk", "jax"])
def test_a_worker_refuses_a_bad_value_with_the_same_error(backend):
    """The worker checks again (it builds from overrides): the error class crosses the pipe."""
    require_backend(backend)
    from tbdzoo.backends.remote import RemoteModel
    md = tbdzoo.get_model("resnet50")
    hp = dict(md.hparams("tiny"), batch_size=-3)  # past this side's check, as a caller could
    with pytest.raises(HyperparameterError, match=r"batch_size of resnet50 = -3 .*>= 1"):
        RemoteModel(md, hp, 0, backend)


def test_steps_per_epoch_follows_the_batch_so_milestones_stay_in_epochs():
    md = tbdzoo.get_model("resnet50")
    assert md.configs["paper"]["steps_per_epoch"] == math.ceil(1281167 / 32)
    assert md.configs["tiny"]["steps_per_epoch"] == 100
    for batch in (32, 256, 1000):
        hp = md.hparams(batch_size=batch)
        spe = hp["steps_per_epoch"]
        assert spe == math.ceil(1281167 / batch)
        assert learning_rate(hp, 30 * spe - 1) == pytest.approx(0.1)
        assert learning_rate(hp, 30 * spe) == pytest.approx(0.01)
    # an explicit epoch length wins over the derived one, with or without a new batch
    assert md.hparams(batch_size=256, steps_per_epoch=7)["steps_per_epoch"] == 7
    assert md.hparams(train_examples=640, batch_size=64)["steps_per_epoch"] == 10


@pytest.mark.parametrize("name,text,value", [
    ("batch_size", "64", 64), ("lr", "1e-3", 1e-3), ("lr", "2", 2.0), ("nesterov", "Yes", True),
    ("nesterov", "0", False), ("nesterov", "false", False), ("optimizer", "adam", "adam"),
    ("blocks", "3, 4,6,3", (3, 4, 6, 3)), ("lr_milestones", "", ()),
])
def test_command_line_text_is_parsed_to_the_rules_type(name, text, value):
    parsed = tbdzoo.get_model("resnet50").rules[name].parse(name, text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("name,text,wanted", [
    ("batch_size", "big", "an integer"), ("lr", "fast", "a number"),
    ("nesterov", "maybe", "true or false"), ("blocks", "3,x", "comma-separated integers"),
])
def test_unreadable_text_names_the_hyperparameter_the_value_and_the_type(name, text, wanted):
    with pytest.raises(HyperparameterError, match="{}: cannot read '{}' as {}".format(name, text, wanted)):
        tbdzoo.get_model("resnet50").rules[name].parse(name, text)


def test_one_optimizer_table_is_what_every_reader_sees():
    """tbdzoo/spec/optimizers.py names the optimizers and their hyperparameters once: the
    models' rule, a program group's fields, the backends' reference and the memory model
    read it, so an optimizer added there is one every reader knows."""
    assert list(OPTIMIZERS) == ["sgd", "adam", "rmsprop"]
    for name, optimizer in OPTIMIZERS.items():
        COMMON["optimizer"].check("optimizer", name, "m")       # a model may name it
        assert OPTIMIZER_FIELDS[name] == ("lr",) + optimizer.hyperparameters
        hp = {k: 1 if k in optimizer.switches else 0.5 for k in optimizer.hyperparameters}
        hp["optimizer"] = name
        assert list(ReferenceOptimizer(hp).hp) == list(optimizer.hyperparameters)
        assert optimizer_slots(hp) == state_slots(name, hp) == optimizer.slots(hp)
    assert NAMES == ("sgd", "adam")          # what a whole model may train with on a backend
    assert hyperparameters({"optimizer": "sgd", "momentum": 0.9, "nesterov": 0,
                            "weight_decay": 1e-4}) == {"momentum": 0.9, "nesterov": False,
                                                       "weight_decay": 1e-4}
    assert [state_slots("sgd", {"momentum": m}) for m in (0.0, 0.9)] == [0, 1]
    assert [state_slots("rmsprop", {"centered": c}) for c in (False, True)] == [2, 3]
    with pytest.raises(HyperparameterError, match="lamb"):
        COMMON["optimizer"].check("optimizer", "lamb", "m")
