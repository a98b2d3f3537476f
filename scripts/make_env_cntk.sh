#!/usr/bin/env bash
# Create the CNTK environment (.venv-cntk, CPython 3.6, the only interpreter CNTK 2.7 supports).
# CNTK 2.7 links against OpenMPI 1.10 (libmpi.so.12, libmpi_cxx.so.1); Debian ships OpenMPI 4.1,
# whose libraries keep the same ABI for what CNTK calls, so we link the old names to the new
# files inside cntk/libs, which CNTK's RUNPATH ($ORIGIN) searches. No LD_LIBRARY_PATH needed.
# Idempotent: a finished environment is recognised by its stamp and left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-cntk
stamp="$venv/.tbdzoo-stamp"
want="$(cat requirements/cntk.txt | sha256sum | cut -c1-16)"

# Debian's OpenMPI: the library CNTK loads, and mpiexec, which starts CNTK's data-parallel
# ranks (docs/distributed.md). Checked before the stamp: an environment built before mpiexec
# was needed gets it too.
libdir=/usr/lib/x86_64-linux-gnu
missing=()
[[ -e $libdir/libmpi.so.40 && -e $libdir/libmpi_cxx.so.40 ]] || missing+=(libopenmpi3)
command -v mpiexec >/dev/null 2>&1 || missing+=(openmpi-bin)
if (( ${#missing[@]} )); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "== installing Debian's ${missing[*]} (CNTK needs an MPI library; its distributed runs need mpiexec)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "make env-cntk: CNTK needs OpenMPI; run 'sudo apt-get install ${missing[*]}' and retry" >&2; exit 1
  fi
fi
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then exit 0; fi

python=${PYTHON36:-}
if [[ -z "$python" ]]; then
  for candidate in python3.6 "$(pyenv root 2>/dev/null)/versions/3.6.15/bin/python"; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 6)' 2>/dev/null; then
      python=$candidate; break
    fi
  done
fi
[[ -n "$python" ]] || { echo "make env-cntk: no CPython 3.6 found (CNTK 2.7 needs exactly 3.6); 'pyenv install 3.6.15' or set PYTHON36=/path/to/python3.6" >&2; exit 1; }

echo "== creating $venv with $python"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade 'pip<22'
"$venv/bin/python" -m pip install -q -r requirements/cntk.txt
site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
ln -sf $libdir/libmpi.so.40 "$site/cntk/libs/libmpi.so.12"
ln -sf $libdir/libmpi_cxx.so.40 "$site/cntk/libs/libmpi_cxx.so.1"
# tbdzoo from this source tree, importable inside the environment too
echo "$PWD" > "$site/tbdzoo-source.pth"
"$venv/bin/python" -c 'import cntk, numpy, tbdzoo; print("    cntk", cntk.__version__, "numpy", numpy.__version__)' 2>&1 | grep -v -i warn
echo "$want" > "$stamp"
