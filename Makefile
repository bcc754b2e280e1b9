# NeuroSandbox: the handful of commands people type.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := orthanc orthanc-dicomweb orthanc-postgresql dcmtk dicom3tools dcm2niix chromium poppler-utils fonts-dejavu-core tesseract-ocr tesseract-ocr-eng postgresql
STAMP := $(VENV)/.setup-done
# OHIF's static files, served by the gateway under /review/viewer/ (viewer/README.md)
VIEWER := viewer/node_modules/@ohif/app/dist/index.html

.PHONY: setup test demo bench lint format clean

setup: $(STAMP) $(VIEWER)

$(STAMP): pyproject.toml Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@[ -x $(PY) ] || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# npm comes with Debian's nodejs+npm or with NodeSource's nodejs (which conflicts with Debian's
# npm package), so the command is checked rather than the package. The touch dates index.html
# after the lockfile (npm keeps the tarball's 1985 dates): a second `make setup` does nothing.
$(VIEWER): viewer/package.json viewer/package-lock.json
	@command -v npm >/dev/null || { echo "Installing system packages: nodejs npm"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm; }
	cd viewer && npm ci --no-audit --no-fund --ignore-scripts
	@touch $@

# Two workers, each test module on one of them (its module and session fixtures with it):
# most tests wait on Orthanc, dcmtk, Chromium or a model server, not on a core.
# PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/neurosandbox demo $(DEMO_ARGS)

bench: setup
	$(PY) bench/render.py

lint: setup
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check dicom gateway evaluation tests bench
	$(VENV)/bin/ruff format --check dicom gateway evaluation tests bench
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format dicom gateway evaluation tests bench
	$(VENV)/bin/ruff check --fix dicom gateway evaluation tests bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
