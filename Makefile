# torch_prnn: `make test` is what CI runs (.ci/run); `make demo` shows it working.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
CFLAGS_TEST = -std=c99 -O2 -Wall -Wextra -Werror -pedantic -Icsrc/kernels

.PHONY: deps build ctest spills install-check pytest test demo clean
# test and demo list their steps in order; keep them in order under make -j too.
.NOTPARALLEL:

# Installs only what is missing (checked by import), so a ready machine costs nothing.
# setuptools >= 64 and wheel: what `pip wheel/install --no-build-isolation` builds with.
deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH_SPEC)"
	@missing=""; \
	for m in pytest ninja numpy wheel; do $(PYTHON) -c "import $$m" 2>/dev/null || missing="$$missing $$m"; done; \
	$(PYTHON) -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 64)" \
	  2>/dev/null || missing="$$missing setuptools>=64"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; $(PYTHON) -m pip install -q $$missing; fi

# MAX_JOBS in the environment limits torch's parallel compile jobs.
build:
	$(PYTHON) setup.py build_ext --inplace

build/test_cpu_reference: tests/c/test_cpu_reference.c csrc/kernels/status.c \
                          csrc/kernels/cpu_reference.c csrc/kernels/cpu_gated.c \
                          csrc/kernels/prnn.h csrc/kernels/prnn_internal.h
	@mkdir -p build
	$(CC) $(CFLAGS_TEST) -o $@ $(filter %.c,$^) -lm

build/test_resident_host: tests/c/test_resident_host.c csrc/kernels/resident_host.c csrc/kernels/status.c \
                          csrc/kernels/prnn.h csrc/kernels/prnn_internal.h
	@mkdir -p build
	$(CC) $(CFLAGS_TEST) -o $@ $(filter %.c,$^)

ctest: build/test_cpu_reference build/test_resident_host
	./build/test_cpu_reference
	./build/test_resident_host

spills:
	$(PYTHON) tools/check_spills.py

# pip wheel + install into a temporary folder, and an editable install into a
# temporary venv; each imported from / and run once. About 40 s on 2 cores,
# most of it the editable build, which compiles _C afresh.
install-check:
	$(PYTHON) tools/install_check.py

# Any non-zero exit fails the target, including 5: no tests collected.
pytest:
	$(PYTHON) -m pytest -q tests

test: deps build ctest spills install-check pytest

demo: deps build
	$(PYTHON) -m torch_prnn.demo

clean:
	rm -rf build dist *.egg-info .pytest_cache torch_prnn/*.so torch_prnn/_build_info.py
	find . -name __pycache__ -prune -exec rm -rf {} +
