"""tbdzoo's ResNet-50 train step against the framework's own model: ``native_models.py
--model resnet50`` under its earlier name (docs/benchmarks.md).

    .venv/bin/python benchmarks/native_resnet50.py                 # all three, a table, JSON
    .venv/bin/python benchmarks/native_resnet50.py --backend torch # one, in this process
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from native_models import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_model="resnet50"))
