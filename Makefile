# Two commands do all set-up: `make demo` and `make test` (both create/reuse .venv and install).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
FMNIST := /usr/share/datasets/fashion-mnist

.PHONY: install demo test test-fast lint docs fmnist

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch first: an unpinned resolve would pull the multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,bench,docs]"
	touch $(STAMP)

install: $(STAMP)

# Full Fashion-MNIST (Debian package); best effort: tests that need it skip with a reason when absent.
fmnist:
	@test -d $(FMNIST) || (command -v apt-get >/dev/null && (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1) || echo "note: Fashion-MNIST not installed (needs apt-get as root)"

demo: install
	$(VENV)/bin/dphype demo

# The modules whose docstrings are checked (pyproject.toml: [tool.dphype.docstrings] checked).
DOCSTRING_MODULES = $(shell $(PY) -c 'import tomllib; \
	print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["dphype"]["docstrings"]["checked"])')

# Style and types of the library (ruff: pyflakes, pycodestyle, isort, pyupgrade, bugbear; mypy on dphype/), its
# import contracts (lint-imports: the layers of docs/architecture.md, no import cycles, Flower only in
# dphype/flower/ and dphype/app/, no benchmark driver in the library; [tool.importlinter] in pyproject.toml), and
# the Google-style docstrings of the listed modules (ruff's pydocstyle rules; pydoclint: every public function's
# arguments, return value and raised exceptions are documented). Not D105 or D107: a magic method follows its
# protocol, and a class docstring documents its constructor.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff check --extend-select D --ignore D105,D107 $(DOCSTRING_MODULES)
	$(VENV)/bin/pydoclint $(DOCSTRING_MODULES)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml: the guides in docs/, the benchmark results, the API reference from the
# docstrings), built offline with every link checked, in build/docs/ (open build/docs/index.html).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/docs

# The fast tests on $(WORKERS) pytest-xdist workers (each worker is its own session: its own temporary folder, FLWR_HOME
# and ports; one torch/BLAS thread each, so that the workers do not oversubscribe the cores), then the slow end-to-end
# tests in two sessions side by side, each running its tests one at a time: the deployments (marker `deployment`:
# SuperNodes with stage timeouts, which two deployments side by side on 2 cores can pass) and the other slow tests
# (Flower simulations, the docs' commands, the bench), whose waits they fill. The deployments' output follows the
# others'. (pytest-xdist's --dist loadgroup would keep a group on one worker, but with pytest 9.2 it silently
# distributes the grouped tests like any others: pytest-xdist issue 1386.) Every part always runs; `make test` fails
# when one fails.
WORKERS ?= 2
THREADS = OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
FAST = $(THREADS) $(PY) -m pytest -q -n $(WORKERS)
SLOW = $(THREADS) $(PY) -m pytest -q -n 0 -m

test: install fmnist lint
	$(FAST); fast=$$?; \
	log=$$(mktemp); $(SLOW) "slow and deployment" >$$log 2>&1 & deployments=$$!; \
	trap 'kill $$deployments 2>/dev/null; rm -f $$log; exit 130' INT TERM; \
	$(SLOW) "slow and not deployment"; slow=$$?; \
	wait $$deployments; deployed=$$?; cat $$log; rm -f $$log; \
	test $$fast -eq 0 -a $$slow -eq 0 -a $$deployed -eq 0

test-fast: install
	$(FAST)
