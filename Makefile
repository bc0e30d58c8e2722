# The two commands of the README.  Everything else is in tools/.
PY ?= python3

.PHONY: demo test asan bench-fio ctest

# The main job: a local file-backed store, KV-sized chunks, throughput.
demo:
	tools/setup.sh
	$(PY) -m fx100io demo

# The whole test suite (installs what it needs, boots the fabric lab).
test:
	tools/test.sh

asan:
	tools/asan_suite.sh

ctest:
	$(MAKE) -C tests/c test && $(MAKE) -C tests/c test SANITIZE=1

bench-fio:
	$(PY) tools/bench_vs_fio.py
