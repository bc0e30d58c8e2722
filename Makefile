# The two commands of the README.  Everything else is in tools/.
PY ?= python3

.PHONY: demo test asan bench-fio ctest fuzz fuzz-replay
FUZZ_SECONDS ?= 600

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

# The coverage-guided fuzzers (tests/fuzz), each for FUZZ_SECONDS; installs clang.
fuzz:
	tools/fuzz.sh $(FUZZ_SECONDS)

# Their corpora (seeds and regression inputs) once each, built with gcc.
fuzz-replay:
	$(MAKE) -s -C tests/fuzz replay
