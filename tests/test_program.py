"""Training programs as data: building, checking against a graph, and JSON."""
import json

import pytest

from tbdzoo.spec import Graph
from tbdzoo.spec.program import Program, ProgramError, clip_of, single_objective

ADAM = {"kind": "adam", "lr": 1e-4, "beta1": 0.0, "beta2": 0.9, "eps": 1e-8, "weight_decay": 0.0}


def two_networks():
    """A generator and a critic in one graph, as WGAN has them."""
    g = Graph("gan")
    z = g.input("noise", (4,))
    real = g.input("real", (6,))
    fake = g.add("generator.fc", "dense", z, units=6)
    fake = g.add("generator.out", "tanh", fake)
    g.add("critic.real", "dense", real, units=1)
    g.add("critic.fake", "dense", fake, units=1, shared={"weight": "critic.real.weight",
                                                        "bias": "critic.real.bias"})
    return g


def wgan_program(n_critic=5):
    p = Program()
    p.loss("fake_score", "mean", x="critic.fake")
    p.loss("real_score", "mean", x="critic.real")
    p.objective("generator", {"fake_score": -1.0})
    p.objective("critic", [("fake_score", 1.0), ("real_score", -1.0)])
    p.group("generator", ["generator"], ADAM)
    p.group("critic", ["critic"], ADAM)
    p.phase("generator", "generator", "generator")
    p.phase("critic", "critic", "critic", repeat=n_critic,
            hooks=[{"kind": "clip_weights", "group": "critic", "value": 0.01}])
    return p


def test_groups_assign_each_trainable_parameter_once():
    g = two_networks()
    owner = wgan_program().check(g).assignment(g)
    assert owner == {"generator.fc.weight": "generator", "generator.fc.bias": "generator",
                     "critic.real.weight": "critic", "critic.real.bias": "critic"}
    assert wgan_program().updates_per_step() == 6


def test_json_round_trip_is_exact():
    p = wgan_program()
    text = json.dumps(p.to_json(), sort_keys=True)
    assert json.dumps(Program.from_json(json.loads(text)).to_json(), sort_keys=True) == text


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p.group("extra", ["generator.fc"], ADAM), "in groups"),
    (lambda p: p.loss("bad", "mean", x="nowhere"), "not a node or input"),
    (lambda p: p.group("unused", ["nothing"], ADAM), "matches no trainable parameter"),
])
def test_a_program_that_does_not_fit_its_graph_is_refused_by_name(mutate, message):
    p = wgan_program()
    mutate(p)
    with pytest.raises(ProgramError, match=message):
        p.check(two_networks())


@pytest.mark.parametrize("build, message", [
    (lambda p: p.objective("o", {"missing": 1.0}), "unknown loss 'missing'"),
    (lambda p: p.group("g", "*", dict(ADAM, kind="lamb")), "optimizer kind 'lamb'"),
    (lambda p: p.group("g", "*", dict(ADAM, beta3=1)), "unknown \\['beta3'\\]"),
    (lambda p: p.group("g", "*", ADAM, clip={"kind": "value", "value": -1}), "clip must be"),
    (lambda p: p.phase("p", "nothing", "critic"), "unknown objective"),
    (lambda p: p.phase("p", "critic", "critic", repeat=0), "repeat must be"),
    (lambda p: p.phase("p", "critic", "critic", hooks=[{"kind": "clip_grad"}]), "hook kind"),
    (lambda p: p.loss("l", "ctc_of_nothing", x="a"), "unknown loss kind"),
])
def test_bad_parts_are_refused_when_added(build, message):
    p = wgan_program()
    with pytest.raises(ValueError, match=message):
        build(p)


def test_a_parameter_outside_every_group_is_named():
    g = two_networks()
    p = Program()
    p.loss("score", "mean", x="critic.real")
    p.objective("critic", {"score": 1.0})
    p.group("critic", ["critic"], ADAM)
    p.phase("critic", "critic", "critic")
    with pytest.raises(ProgramError, match="'generator.fc.weight' belongs to no group"):
        p.check(g)


def test_single_objective_programs_take_the_flat_hyperparameters():
    g = Graph("m")
    x = g.input("x", (3,))
    g.input("y", (), dtype="int32", role="target")
    g.add("fc", "dense", x, units=2)
    hp = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False,
          "weight_decay": 1e-4, "lr_schedule": "step", "lr_decay": 0.1,
          "lr_milestones": (30, 60), "steps_per_epoch": 100}
    p = single_objective(g, hp, "softmax_cross_entropy", logits="fc", labels="y")
    assert p.groups["all"]["optimizer"]["momentum"] == 0.9
    assert p.groups["all"]["schedule"]["lr_milestones"] == [30, 60]
    with pytest.raises(ValueError, match="labels"):
        single_objective(g, hp, "softmax_cross_entropy", logits="fc", labels="x")


def test_single_objective_names_its_loss_and_clips_as_the_hyperparameters_say():
    g = Graph("m")
    x = g.input("x", (3,))
    g.input("y", (), dtype="int32", role="target")
    g.add("fc", "dense", x, units=2)
    hp = {"optimizer": "adam", "lr": 3e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
          "weight_decay": 0.0, "lr_schedule": "constant", "grad_clip_norm": 0.0,
          "grad_clip_value": 100.0}
    p = single_objective(g, hp, "softmax_cross_entropy", clip=clip_of(hp), name="xent",
                         logits="fc", labels="y", label_smoothing=0.1)
    assert list(p.losses) == ["xent"] and p.objectives == {"xent": [["xent", 1.0]]}
    assert p.losses["xent"]["attrs"]["label_smoothing"] == 0.1
    assert dict(p.groups["all"]["clip"]) == {"kind": "value", "value": 100.0}
    assert [(ph["name"], ph["objective"], ph["update"]) for ph in p.phases] == \
        [("train", "xent", "all")]
    assert dict(clip_of(dict(hp, grad_clip_value=0.0, grad_clip_norm=1.0))) == \
        {"kind": "global_norm", "value": 1.0}
    assert clip_of(dict(hp, grad_clip_value=0.0)) is None and clip_of({}) is None
    with pytest.raises(ProgramError, match="both set"):
        clip_of(dict(hp, grad_clip_norm=1.0))
