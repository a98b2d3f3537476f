#!/usr/bin/env bash
# Create the JAX environment (.venv-jax, CPython 3.11) with JAX, Flax and Optax. JAX's wheels
# need NumPy 2 and the main environment pins NumPy 1.26 for MXNet, so JAX lives apart and the
# main interpreter reaches it through a worker (tbdzoo/backends/remote.py), as it reaches CNTK.
# Idempotent: a finished environment is recognised by its stamp and left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-jax
stamp="$venv/.tbdzoo-stamp"
want="$(cat requirements/jax.txt setup.cfg | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then exit 0; fi

python=${PYTHON311:-}
if [[ -z "$python" ]]; then
  for candidate in python3.11 "$(pyenv root 2>/dev/null)/versions/3.11.7/bin/python"; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
      python=$candidate; break
    fi
  done
fi
[[ -n "$python" ]] || { echo "make env-jax: no CPython 3.11 found; install one or set PYTHON311=/path/to/python3.11" >&2; exit 1; }

echo "== creating $venv with $python"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r requirements/jax.txt
"$venv/bin/python" -m pip install -q --no-deps -e .
for name in jax flax optax; do
  "$venv/bin/python" -c "import $name; print('   ', '$name', $name.__version__)" || { echo "make env-jax: $name does not import" >&2; exit 1; }
done
echo "$want" > "$stamp"
