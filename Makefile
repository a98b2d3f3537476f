# The README's two commands: `make bench` and `make test`. Each creates what it needs.
.PHONY: bench test env env-main env-cntk env-jax chromium debian-packages clean-env

VENV_PY := .venv/bin/python
RESULTS ?= results/bench.jsonl

bench: env debian-packages
	@mkdir -p $(dir $(RESULTS))
	$(VENV_PY) -m tbdzoo.cli bench -o $(RESULTS)
	$(VENV_PY) -m tbdzoo.cli report $(RESULTS) -o results/report

# ruff first (pyproject.toml's [tool.ruff]): a lint failure ends the run before the slow tests.
test: env chromium debian-packages
	$(VENV_PY) -m ruff check .
	$(VENV_PY) -m pytest -q tests

env: env-main env-cntk env-jax

env-main:
	@scripts/make_env_main.sh

env-cntk:
	@scripts/make_env_cntk.sh

# JAX, Flax and Optax need NumPy 2, which MXNet's NumPy 1 pin rules out of .venv.
env-jax:
	@scripts/make_env_jax.sh

chromium:
	@scripts/ensure_chromium.sh

# Fashion-MNIST and espeak-ng, read by `tbd data make` (docs/datasets.md).
debian-packages:
	@scripts/ensure_debian_packages.sh

clean-env:
	rm -rf .venv .venv-cntk .venv-jax
