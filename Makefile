# The two commands of the README. Both install what they need into .venv first.
.PHONY: install run selfplay test test-e2e test-envs test-all lint

install: .venv/.installed

.venv/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh
	touch $@

run: install  ## the main job on its embedded default: tiny local model, SFT from the expert, GRPO self-play
	.venv/bin/python -m core.run

selfplay: install  ## self-play rounds with the expert teacher, no learning (seconds)
	.venv/bin/python -m core.run experiment=selfplay

test: install  ## the default test run, in-process (no red team, end-to-end, slow or GPU tests: ~8 min on 2 cores)
	.venv/bin/python -m pytest -q -m "not slow and not gpu and not e2e" -n 2 --durations=20

test-e2e: install  ## the red team, the verifier suites of real workers and the CLIs in subprocesses (CI runs it too)
	.venv/bin/python -m pytest -q -m "e2e and not slow and not gpu" -n 2 --durations=20

test-envs:  ## the verifiers, OpenEnv and verl adapters, each in a venv of its own with the real library (they conflict); CI runs it too
	bash scripts/test_envs.sh

test-all: install  ## every test, slow ones included (GPU tests skip without a GPU)
	.venv/bin/python -m pytest -q

lint: install
	.venv/bin/ruff check core plugins tests
