#!/usr/bin/env bash
# Create the main environment (.venv, CPython 3.11) with TensorFlow, MXNet and PyTorch.
# Idempotent: a finished environment is recognised by its stamp and left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
stamp="$venv/.tbdzoo-stamp"
want="$(cat requirements/main.txt setup.cfg | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then exit 0; fi

python=${PYTHON311:-}
if [[ -z "$python" ]]; then
  for candidate in python3.11 "$(pyenv root 2>/dev/null)/versions/3.11.7/bin/python"; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
      python=$candidate; break
    fi
  done
fi
[[ -n "$python" ]] || { echo "make env-main: no CPython 3.11 found; install one or set PYTHON311=/path/to/python3.11" >&2; exit 1; }

echo "== creating $venv with $python"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r requirements/main.txt
"$venv/bin/python" -m pip install -q --no-deps -e .
# One process per framework: they must each import cleanly, and some pairs (MXNet with
# torchvision) cannot share one process, which is why every benchmark run gets a worker.
for name in tensorflow mxnet torch torchvision; do
  "$venv/bin/python" -c "import numpy; numpy.bool = bool; import $name; print('   ', '$name', $name.__version__)" 2>&1 | grep -v -e '^I0000' -e 'oneDNN' -e 'cpu_feature_guard' -e 'To enable the following' || true
  "$venv/bin/python" -c "import numpy; numpy.bool = bool; import $name" 2>/dev/null || { echo "make env-main: $name does not import" >&2; exit 1; }
done
echo "$want" > "$stamp"
