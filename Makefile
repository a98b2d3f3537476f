# The README's two commands: `make bench` and `make test`. Each creates what it needs.
.PHONY: bench test env env-main env-cntk clean-env

VENV_PY := .venv/bin/python

bench: env
	$(VENV_PY) -m tbdzoo.cli bench

test: env
	$(VENV_PY) -m pytest -q tests

env: env-main env-cntk

env-main:
	@scripts/make_env_main.sh

env-cntk:
	@scripts/make_env_cntk.sh

clean-env:
	rm -rf .venv .venv-cntk
