# The two commands of the README. Both install what they need into .venv first.
.PHONY: install run train test test-all lint

install: .venv/.installed

.venv/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh
	touch $@

run: install  ## the main job on its embedded default
	.venv/bin/python -m core.run

train: install  ## the embedded training run: tiny local model, SFT from the expert, GRPO self-play
	.venv/bin/python -m core.run experiment=embedded

test: install  ## the default test run (no slow or GPU tests)
	.venv/bin/python -m pytest -q -m "not slow and not gpu" -n 2

test-all: install  ## every test, slow ones included (GPU tests skip without a GPU)
	.venv/bin/python -m pytest -q

lint: install
	.venv/bin/ruff check core plugins tests
