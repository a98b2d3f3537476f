"""tbdzoo's ResNet-50 train step against the framework's own model: ``native_models.py
--model resnet50`` under its earlier name (docs/benchmarks.md).

    .venv/bin/python -m benchmarks.native_resnet50                 # all three, a table, JSON
    .venv/bin/python -m benchmarks.native_resnet50 --backend torch # one, in this process
"""
import sys

from benchmarks.native_models import main

if __name__ == "__main__":
    sys.exit(main(default_model="resnet50"))
