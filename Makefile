# The README's two commands: `make bench` and `make test`. Each creates what it needs.
.PHONY: bench test env env-main env-cntk chromium clean-env

VENV_PY := .venv/bin/python
RESULTS ?= results/bench.jsonl

bench: env
	@mkdir -p $(dir $(RESULTS))
	$(VENV_PY) -m tbdzoo.cli bench -o $(RESULTS)
	$(VENV_PY) -m tbdzoo.cli report $(RESULTS) -o results/report

test: env chromium
	$(VENV_PY) -m pytest -q tests

env: env-main env-cntk

env-main:
	@scripts/make_env_main.sh

env-cntk:
	@scripts/make_env_cntk.sh

chromium:
	@scripts/ensure_chromium.sh

clean-env:
	rm -rf .venv .venv-cntk
