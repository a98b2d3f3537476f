"""setup.cfg's extras pin what requirements/ pins, so `pip install tbdzoo[...]` and `make env`
install the same versions."""
import configparser
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def requirements(name):
    with open(os.path.join(ROOT, "requirements", name)) as f:
        lines = [line.split("#")[0].strip() for line in f]
    return sorted(line for line in lines if line)


def extras():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    section = config["options.extras_require"]
    return {name: sorted(p.strip() for p in re.split(r"[;\n]", section[name]) if p.strip())
            for name in section}


def test_the_extras_pin_what_the_requirements_pin():
    groups = extras()
    assert groups["cntk"] == requirements("cntk.txt")
    main = sorted(p for name, pins in groups.items() if name != "cntk" for p in pins)
    assert main == requirements("main.txt"), "setup.cfg's extras and requirements/main.txt differ"


def test_the_description_names_every_model():
    import tbdzoo
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    description = config["metadata"]["description"]
    names = {"resnet50": "ResNet-50", "transformer": "Transformer", "inception_v3": "Inception-v3",
             "wgan": "WGAN", "seq2seq": "Seq2Seq", "deepspeech2": "Deep Speech 2", "a3c": "A3C",
             "faster_rcnn": "Faster R-CNN"}
    assert sorted(names) == sorted(tbdzoo.list_models())
    assert all(names[m] in description for m in names), description
    assert "{} DNN models".format(["", "one", "two", "three", "four", "five", "six", "seven",
                                   "eight"][len(names)]) in description
