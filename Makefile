# zest: the two commands of the README are `make train` and `make test`; the rest serve them.
#   make deps       install missing Debian packages (fast no-op when present)
#   make build      configure build/ (Ninja, RelWithDebInfo, -Werror) once, then build
#   make test       the whole suite except gpu-labelled tests (installs chromium for the
#                   browser-labelled ones); extra ctest flags: CTEST_ARGS=...
#   make test-gpu   the gpu-labelled tests (on a machine with a GPU)
#   make test-browser  only the browser-labelled tests: the HTML pages drawn by headless
#                   chromium, screenshots in build/screenshots/
#   make train      builds only zest-train, then runs the default job (configs/default.json),
#                   its metrics and run report in build/train/ (metrics.jsonl, report.html)
#   make sanitize   ASan+UBSan build (clang) in build-asan/, quick tests
#   make tsan       TSan build in build-tsan/, the suites whose ranks and streams are threads
#   make fuzz       the libFuzzer programs, built in build-asan/ too, fuzz-smoke tests (tests/fuzz/)
#   make bench      every benchmark program
#   make clean      remove the build folders
# Extra configure flags for a fresh build folder: CMAKE_ARGS=... (e.g. -DZEST_CUDA=OFF).

NPROC       ?= $(shell nproc 2>/dev/null || echo 2)
BUILD_DIR   ?= build
CMAKE_ARGS  ?=
CTEST_ARGS  ?=
TRAIN_CONFIG ?= configs/default.json
TRAIN_ARGS  ?=
TRAIN_OUT   ?= $(BUILD_DIR)/train

CTEST = ctest --output-on-failure

# $(call configure,DIR,FLAGS): configure DIR only if it has never been configured; a folder whose
# last configure failed is configured again with the flags it has cached.
define configure
	@if [ ! -f $(1)/CMakeCache.txt ]; then \
	  echo "+ cmake -S . -B $(1) -G Ninja $(strip $(2) $(CMAKE_ARGS))"; \
	  cmake -S . -B $(1) -G Ninja $(2) $(CMAKE_ARGS); \
	elif [ ! -f $(1)/build.ninja ] && [ ! -f $(1)/Makefile ]; then \
	  echo "+ cmake -S . -B $(1)"; \
	  cmake -S . -B $(1); \
	fi
endef

.PHONY: all deps deps-browser configure build test test-gpu test-browser train sanitize tsan \
        fuzz bench clean

all: build

deps:
	@tools/setup/install-deps.sh

deps-browser:
	@tools/setup/install-deps.sh browser

# Note: line tables only (-g1) in the default build: backtraces, sanitizers and profilers get
# file:line, and a test file compiles in about two thirds of the time it takes at -g (measured
# 6.1 s against 9.5 s for tests/engine/parity_test.cc), which is most of CI's build. For a
# debugger that shows variables, configure another folder:
# make build BUILD_DIR=build-debug CMAKE_ARGS=-DCMAKE_BUILD_TYPE=Debug
DEFAULT_OPTIMIZATION = "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"

configure: deps
	$(call configure,$(BUILD_DIR),-DCMAKE_BUILD_TYPE=RelWithDebInfo $(DEFAULT_OPTIMIZATION) -DZEST_WERROR=ON)

build: configure
	cmake --build $(BUILD_DIR) -j$(NPROC)

# Note: the whole suite includes the pages opened in headless chromium, so `make test` installs it
# (a large package, once); `make train` does not need it. A machine that cannot install it still
# runs the rest: the browser-labelled tests then skip, saying why.
test: build
	@tools/setup/install-deps.sh browser || \
	  echo "make test: chromium could not be installed; the browser-labelled tests will skip"
	$(CTEST) --test-dir $(BUILD_DIR) -j$(NPROC) --no-tests=error -LE gpu $(CTEST_ARGS)

test-gpu: build
	$(CTEST) --test-dir $(BUILD_DIR) -L gpu $(CTEST_ARGS)

# The suite and the tools it runs, not the whole build: the pages need the tools only.
test-browser: deps-browser configure
	cmake --build $(BUILD_DIR) -j$(NPROC) --target tools_report_browser_test
	$(CTEST) --test-dir $(BUILD_DIR) --no-tests=error -L browser $(CTEST_ARGS)

# Note: the default job needs only the trainer (the library and one tool), not the ~300 test and
# benchmark programs that `make test` builds: a fresh clone starts training several times sooner.
train: configure
	cmake --build $(BUILD_DIR) -j$(NPROC) --target zest-train
	@mkdir -p $(TRAIN_OUT)
	$(BUILD_DIR)/bin/zest-train --config $(TRAIN_CONFIG) --metrics $(TRAIN_OUT)/metrics.jsonl \
	  --report $(TRAIN_OUT)/report.html $(TRAIN_ARGS)

# Note: sanitizer builds are CPU-only (the CUDA runtime does not start under ASan's default
# shadow layout, and nvcc-compiled code is not instrumented anyway), skip the benchmarks, and
# leave out MPI: its suites run ranks as Open MPI processes, and Open MPI is not instrumented (its
# own allocations and shared-memory transport are all a sanitizer would report on). Ranks as
# threads, the `local` backend, are what they check.
# Note: the hardening builds (sanitize, tsan, fuzz) compile at -O1 with line tables only (-g1):
# a sanitizer's report needs function names and file:line, not variables, and under ASan + UBSan
# GCC took 2.8x as long at -O2 -g (tests/config/train_config_test.cc: 71.7 s against 25.6 s), the
# larger part of CI's time. -O1 is the level the sanitizers' documentation advises.
HARDENING_OPTIMIZATION = "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
SANITIZER_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo $(HARDENING_OPTIMIZATION) -DZEST_CUDA=OFF \
                  -DZEST_MPI=OFF -DZEST_BENCHMARKS=OFF -DZEST_WERROR=ON

# Note: ASan + UBSan and the fuzzers share one clang folder, build-asan/: libFuzzer needs clang,
# and one instrumented library (ASan + UBSan + libFuzzer's coverage, fuzzer-no-link) serves both
# the quick suites and the fuzzers, so CI compiles the library three times, not four. Clang also
# compiles an ASan + UBSan file in half to two thirds of GCC's time (measured: 8.0 s against
# 12.1 s for tests/engine/parity_test.cc, 5.1 s against 10.2 s for engine/zero_trainer.cc);
# GCC's warnings are checked by the default build, clang's here.
ASAN_FLAGS = $(SANITIZER_FLAGS) -DCMAKE_CXX_COMPILER=clang++ -DZEST_SANITIZE=address -DZEST_FUZZ=ON

# A build-asan/ configured before the folders were shared (GCC, no fuzzers) is named, not reused.
define check_asan_folder
	@if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^ZEST_FUZZ:BOOL=ON' build-asan/CMakeCache.txt; then \
	  echo "build-asan/ was configured without ZEST_FUZZ (an older layout); remove it: rm -rf build-asan build-fuzz" >&2; \
	  exit 2; \
	fi
endef

# Every quick suite; install.* is left to `make test` (it packages, it checks no memory).
sanitize: deps
	$(check_asan_folder)
	$(call configure,build-asan,$(ASAN_FLAGS))
	cmake --build build-asan -j$(NPROC)
	$(CTEST) --test-dir build-asan -j$(NPROC) --no-tests=error -L quick -E '^install[.]' \
	  $(CTEST_ARGS)

# The suites whose ranks, streams and collectives are threads, the kernels' helper threads, and
# zest-train's (its ranks are threads; the tool is built with TSan too). Only these are built:
# TSan slows everything 5-15x, and single-threaded suites have nothing for it to find. Suites not
# built show up in ctest as <target>_NOT_BUILT without labels, so -L quick skips them.
TSAN_SUITES ?= runtime_cpu_stream_test runtime_held_frees_test runtime_local_communicator_test runtime_local_communicator_failures_test \
               runtime_checked_communicator_test runtime_world_test engine_parity_test \
               engine_overlap_test engine_mixed_precision_test engine_max_live_parameters_test \
               checkpoint_resume_test checkpoint_reshard_test \
               engine_fault_injection_test kernels_kernel_threads_test tools_zest_train_test \
               tools_zest_train_checkpoint_test runtime_world_stall_test \
               runtime_point_to_point_test runtime_communicator_groups_test \
               pipeline_schedule_on_ranks_test engine_recompute_test \
               memory_swap_store_test engine_nvme_offload_test engine_outer_loop_test \
               models_tensor_parallel_gpt_test pipeline_tensor_parallel_pipeline_test \
               engine_state_readers_test engine_divergence_report_test
tsan: deps
	$(call configure,build-tsan,$(SANITIZER_FLAGS) -DZEST_SANITIZE=thread)
	cmake --build build-tsan -j$(NPROC) --target $(TSAN_SUITES)
	$(CTEST) --test-dir build-tsan -j$(NPROC) --no-tests=error -L quick -E '^install[.]' \
	  $(CTEST_ARGS)

# The fuzzers in the ASan folder (see `sanitize`); after `make sanitize` only they are left to
# build.
fuzz: deps
	$(check_asan_folder)
	$(call configure,build-asan,$(ASAN_FLAGS))
	cmake --build build-asan -j$(NPROC) --target zest_fuzzers
	$(CTEST) --test-dir build-asan -j$(NPROC) --no-tests=error -L fuzz-smoke $(CTEST_ARGS)

bench: build
	@set -e; found=0; \
	for bench in $(BUILD_DIR)/bin/*_bench; do \
	  [ -x "$$bench" ] || continue; found=1; \
	  echo "+ $$bench"; "$$bench"; \
	done; \
	[ $$found = 1 ] || echo "bench: no benchmark programs in $(BUILD_DIR)/bin yet"

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz
