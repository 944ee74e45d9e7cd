#!/usr/bin/env bash
# Builds zest with nvcc, runs the gpu-labelled tests (`ctest -L gpu`) and the GPU benchmarks on a
# machine with a GPU and the CUDA toolkit but without the Debian -dev packages zest builds with
# (and no network).
#
#   tools/gpu-check.sh prepare   on a Debian machine with the packages (`make deps`): copies the
#                                host dependencies zest needs into .gpu-deps/ (git-ignored,
#                                about 45 MiB), to carry to the GPU machine with the tree
#   tools/gpu-check.sh [run]     on the GPU machine: configures build-gpu/ against .gpu-deps/
#                                (where present, else the system's packages), builds libzest,
#                                the gpu-labelled suites and the CUDA benchmarks only, runs the
#                                suites, then the benchmarks (below), then, with what budget is
#                                left, the kernel suites under compute-sanitizer's memcheck, and
#                                writes everything under $OUT (or build-gpu/gpu-check/)
#
# What lands in $OUT: gpu-check.log (all output), ctest-gpu.xml (JUnit), phases.tsv (each phase's
# exit status and seconds), report.md (tools/reference/gpu_report.py: the key ratios), and
# results.tar.gz: adamw_cuda_bench.json and gpt_cuda_bench_*.json (Google Benchmark JSON),
# torch_adamw.jsonl and torch_gpt.jsonl (tools/reference/torch_*_bench.py, where python3 imports
# torch). Five files: the lent machines' tool brings back at most 8 (`gpu_report.py DIR` renders
# the report again from a folder holding them, the archive packed or not).
# Every phase runs under `timeout`, within what is left of a budget for the whole run
# (ZEST_GPU_CHECK_BUDGET_S, 540 s: a phase that would start with too little left is skipped);
# a failed phase does not stop the later ones. The exit status is the build's or ctest's:
# the benchmarks' statuses are in phases.tsv and report.md. On a lent machine the default budget
# fits one 600 s command (give it timeout_s 600) with .gpu-deps carried; on 2 cores the build
# takes 180 to 270 s (181 s on 2026-12-02, fresh), on the lent machine's 16 well under its 300 s.
#
# Note: the dependencies are the prepared machine's own Debian files (headers, CMake packages,
# GoogleTest's static libraries, Google Benchmark, and the shared libraries libzest links: fmt,
# xxhash, OpenBLAS with libgfortran), not sources built there: OpenBLAS would take longer to
# build than the check itself. Debian 12's libraries need glibc 2.36, so the GPU machine needs
# glibc 2.36 or later. Warnings are not errors there (another host compiler may warn
# differently); CI holds -Werror. The Python scripts run with the machine's own library path,
# not the carried one.
# Environment: ZEST_GPU_BUILD_DIR (build-gpu), ZEST_CUDA_ARCHS (90), JOBS (nproc), OUT,
# ZEST_GPU_CHECK_BUDGET_S (540), PYTHON (python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

deps=.gpu-deps
mode=${1:-run}

prepare() {
  command -v dpkg >/dev/null || { echo "gpu-check: prepare needs dpkg (Debian)" >&2; exit 1; }
  local packages=(nlohmann-json3-dev libfmt-dev libfmt9 libgtest-dev libgmock-dev libcli11-dev
                  libxxhash-dev libxxhash0 libopenblas-dev libopenblas-pthread-dev
                  libopenblas0-pthread libgfortran5 libquadmath0
                  libbenchmark-dev libbenchmark1debian)
  rm -rf "$deps"
  mkdir -p "$deps"
  local package path files=()
  for package in "${packages[@]}"; do
    if ! dpkg -s "$package" >/dev/null 2>&1; then
      echo "gpu-check: $package is not installed; run make deps" >&2
      exit 1
    fi
    # Headers, CMake packages and libraries; not docs, nor static OpenBLAS/LAPACK (100 MiB).
    while IFS= read -r path; do
      [[ -f $path || -L $path ]] || continue
      case $path in
        /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;;
        */openblas-pthread/*.a | */openblas-pthread/liblapack* | */openblas-pthread/libblas*)
          continue ;;
      esac
      files+=("$path")
    done < <(dpkg -L "$package")
  done
  # tar keeps the paths (less the leading /) and symbolic links as links.
  printf '%s\n' "${files[@]}" | tar --no-recursion -cf - -T - 2>/dev/null | tar -xf - -C "$deps"
  # /lib is /usr/lib on merged-/usr systems: keep one tree.
  if [[ -d $deps/lib ]]; then
    mkdir -p "$deps/usr/lib"
    cp -a "$deps/lib/." "$deps/usr/lib/"
    rm -rf "$deps/lib"
  fi
  # Links to what no listed package holds (usr/src/gtest -> googletest, in another package).
  find "$deps" -xtype l -delete
  echo "gpu-check: $(du -sh "$deps" | cut -f1) of dependencies in $deps/;" \
       "carry it to the GPU machine"
}

# Phases of `run`: each appends "name<TAB>exit status<TAB>seconds<TAB>note" to $phases.
record_phase() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$phases"
}

# phase NAME CAP_S STDOUT COMMAND...: runs COMMAND under timeout, for at most CAP_S seconds and
# what is left of the budget (less a reserve for the report), its standard output into the file
# STDOUT ("-": the log); records its exit status in $phases and returns it, or returns 125
# without running it when under 20 s are left.
phase() {
  local name=$1 cap=$2 stdout=$3
  shift 3
  local left=$((budget - SECONDS - 15))
  local limit=$((cap < left ? cap : left))
  if ((limit < 20)); then
    echo "gpu-check: == $name: skipped, ${left}s of the budget left"
    record_phase "$name" skipped 0 "budget spent"
    return 125
  fi
  echo "gpu-check: == $name (at most ${limit}s)"
  local start=$SECONDS status=0 note=""
  if [[ $stdout == - ]]; then
    timeout -k 10 "$limit" "$@" || status=$?
  else
    timeout -k 10 "$limit" "$@" >"$stdout" || status=$?
    cat "$stdout"
  fi
  ((status == 124 || status == 137)) && note="timed out after ${limit}s"
  echo "gpu-check: == $name exited with $status after $((SECONDS - start))s${note:+ ($note)}"
  record_phase "$name" "$status" "$((SECONDS - start))" "$note"
  return "$status"
}

# gpt_bench NAME FILTER [SECONDS]: gpt_cuda_bench's rows matching FILTER (and the GEMM
# ceiling), as JSON, within SECONDS (120).
gpt_bench() {
  phase "$1" "${3:-120}" - "$build/bin/gpt_cuda_bench" \
    --benchmark_filter="BM_Bf16GemmCeiling|$2" \
    --benchmark_out="$out/$1.json" --benchmark_out_format=json
}

# torch_gpt NAME CAP_S ARGS...: one torch_gpt_bench.py run; its JSON line goes to
# $build/NAME.jsonl (not $OUT: files there are counted) and is appended to torch_gpt.jsonl.
torch_gpt() {
  local name=$1 cap=$2
  shift 2
  local status=0
  rm -f "$build/$name.jsonl"
  phase "$name" "$cap" "$build/$name.jsonl" "${python[@]}" tools/reference/torch_gpt_bench.py \
    "$@" || status=$?
  if [[ -f $build/$name.jsonl ]]; then
    cat "$build/$name.jsonl" >>"$out/torch_gpt.jsonl"
  fi
  return "$status"
}

run() {
  build=${ZEST_GPU_BUILD_DIR:-build-gpu}
  out=${OUT:-$build/gpu-check}
  budget=${ZEST_GPU_CHECK_BUDGET_S:-540}
  local jobs=${JOBS:-$(nproc)}
  mkdir -p "$out" "$build"
  out=$(cd "$out" && pwd)
  phases="$out/phases.tsv"
  : >"$phases"
  rm -f "$out"/adamw_cuda_bench.json "$out"/gpt_cuda_bench_*.json "$out"/torch_*.jsonl \
        "$out/ctest-gpu.xml" "$out/report.md" "$out/results.tar.gz"
  local log="$out/gpu-check.log"
  : >"$log"
  # The original stdout and stderr are kept (3, 4) to wait for tee at the end: the device tool
  # ends processes left running when the command returns, and tee might not have written the
  # log's last lines yet (a bounded wait: a process a timeout orphaned may hold its pipe open).
  exec 3>&1 4>&2 > >(tee -a "$log") 2>&1
  local tee_pid=$!

  local nvcc=${CUDACXX:-}
  [[ -z $nvcc ]] && nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  echo "gpu-check: $(uname -srm), $jobs jobs, nvcc $("$nvcc" --version | tail -1)," \
       "budget ${budget}s"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  # cmake and ninja: on the lent machines pip's, in the scripts folder of the python3 with torch.
  local scripts generator=Ninja
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    scripts=$("${PYTHON:-python3}" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' \
              2>/dev/null) && PATH=$PATH:$scripts
  fi
  command -v ninja >/dev/null || generator="Unix Makefiles"
  echo "gpu-check: $(cmake --version | head -n 1), $generator," \
       "$("${CXX:-c++}" --version | head -n 1), $(getconf GNU_LIBC_VERSION)"

  # The Python scripts get the machine's own library path, not the carried libraries'.
  python=(env)
  if [[ -n ${LD_LIBRARY_PATH:-} ]]; then
    python+=(LD_LIBRARY_PATH="$LD_LIBRARY_PATH")
  else
    python+=(-u LD_LIBRARY_PATH)
  fi
  python+=("${PYTHON:-python3}")

  local configure=(-S . -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEST_CUDA=ON
                   -DCMAKE_CUDA_COMPILER="$nvcc" -DZEST_CUDA_ARCHS="${ZEST_CUDA_ARCHS:-90}"
                   -DZEST_MPI=OFF -DZEST_BENCHMARKS=ON -DZEST_WERROR=OFF)
  if [[ -d $deps ]]; then
    local root=$PWD/$deps/usr lib=$PWD/$deps/usr/lib/x86_64-linux-gnu
    configure+=(-DCMAKE_PREFIX_PATH="$root"
                -Dnlohmann_json_DIR="$root/share/cmake/nlohmann_json"
                -DCLI11_DIR="$root/share/cmake/CLI11"
                -Dfmt_DIR="$lib/cmake/fmt" -DGTest_DIR="$lib/cmake/GTest"
                -Dbenchmark_DIR="$lib/cmake/benchmark"
                -DZEST_XXHASH_INCLUDE_DIR="$root/include" -DZEST_XXHASH_LIBRARY="$lib/libxxhash.so"
                -DZEST_CBLAS_INCLUDE_DIR="$root/include/x86_64-linux-gnu/openblas-pthread"
                -DZEST_OPENBLAS_LIBRARY="$lib/openblas-pthread/libopenblas.so")
    # The test programs run at build time (test discovery) and under ctest, and the benchmarks
    # after: all find the carried libraries here.
    export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi

  # NCCL: beside the toolkit, under NCCL_HOME, or else (the GPU machine's image) in pip's
  # nvidia-nccl package of the python3 that holds PyTorch, which ships libnccl.so.2 only.
  local toolkit
  toolkit=$(cd "$(dirname "$nvcc")/.." 2>/dev/null && pwd) || toolkit=/usr/local/cuda
  if [[ -z ${NCCL_HOME:-} && ! -f $toolkit/include/nccl.h && ! -f /usr/include/nccl.h ]]; then
    local nccl_dir nccl_library
    nccl_dir=$("${PYTHON:-python3}" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' \
               2>/dev/null || true)
    nccl_library=$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -n 1 || true)
    if [[ -n $nccl_dir && -f $nccl_dir/include/nccl.h && -n $nccl_library ]]; then
      echo "gpu-check: NCCL from $nccl_dir"
      configure+=(-DZEST_NCCL_INCLUDE_DIR="$nccl_dir/include" -DZEST_NCCL_LIBRARY="$nccl_library")
      export LD_LIBRARY_PATH="$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
      echo "gpu-check: no NCCL beside $toolkit, in /usr/include or in python's nvidia.nccl;" \
           "set NCCL_HOME"
    fi
  fi

  # The gpu-labelled suites (cmake/ZestTests.cmake: a `// ctest-labels:` line naming gpu in the
  # first 10 lines), as targets: tests/kernels/adamw_cuda_test.cc is kernels_adamw_cuda_test.
  local targets=(zest) file target
  while IFS= read -r file; do
    if head -n 10 "$file" | grep -Eq '^[[:space:]]*//[[:space:]]*ctest-labels:.*\bgpu\b'; then
      target=${file#tests/}
      target=${target%.*}
      targets+=("${target//\//_}")
    fi
  done < <(find tests -path tests/consumer -prune -o -path tests/fuzz -prune -o \
             \( -name '*_test.cc' -o -name '*_test.cu' \) -print | sort)
  local benchmarks=(adamw_cuda_bench gpt_cuda_bench)

  local status=0
  phase configure 120 - cmake "${configure[@]}" || status=$?
  if ((status == 0)); then
    echo "gpu-check: building ${targets[*]}"
    phase build 300 - cmake --build "$build" -j "$jobs" --target "${targets[@]}" || status=$?
  fi
  if ((status == 0)); then
    # Note: a gpu suite takes seconds on an H200; a hung one must not take the whole budget.
    # Four at a time: each suite is its own process with its own CUDA context and CPU reference
    # run, the GPU has memory for all four, and none times anything.
    phase ctest-gpu 180 - ctest --test-dir "$build" -L gpu -j 4 --output-on-failure --timeout 120 \
          --output-junit "$out/ctest-gpu.xml" || status=$?
    echo "gpu-check: ctest -L gpu exited with $status; report $out/ctest-gpu.xml"
  fi

  # The benchmarks: zest's (Google Benchmark JSON) and PyTorch's on the same sizes, the
  # cheapest and most wanted first; later ones are skipped when the budget runs out.
  local built=0 torch=0
  if [[ -d $build/CMakeFiles ]] &&
     phase build-benchmarks 120 - cmake --build "$build" -j "$jobs" --target "${benchmarks[@]}"
  then
    built=1
  fi
  if phase torch-import 60 - "${python[@]}" -c 'import torch; assert torch.cuda.is_available()'
  then
    torch=1
  fi
  if ((built)); then
    phase adamw_cuda_bench 90 - "$build/bin/adamw_cuda_bench" \
      --benchmark_out="$out/adamw_cuda_bench.json" --benchmark_out_format=json || true
  fi
  if ((torch)); then
    phase torch_adamw 120 "$out/torch_adamw.jsonl" "${python[@]}" \
      tools/reference/torch_adamw_bench.py || true
  fi
  # GPT-2 small at stages 0 and 3; the smaller GPT only where GPT-2 small failed at run time
  # (status 1: out of memory, a device error) or ran out of time, not where World refused.
  local stage0=0 stage3=0 small=0
  if ((built)); then
    gpt_bench gpt_cuda_bench_stage0 'BM_GptStep/gpt2-small/stage:0/' || stage0=$?
    if ((stage0 != 2 && stage0 != 125)); then
      # The offload row takes its GPU cap from the stage-3 row of the same process.
      gpt_bench gpt_cuda_bench_stage3 'BM_GptStep/gpt2-small/stage:3/|BM_GptOffload/gpt2-small/' \
        180 || stage3=$?
    fi
    if [[ " $stage0 $stage3 " =~ \ (1|124|137)\  ]]; then
      small=1
      gpt_bench gpt_cuda_bench_small 'BM_GptStep/gpt2-6L/' || true
    fi
  fi
  if ((torch)); then
    torch_gpt torch_gpt_eager 120 --model gpt2-small --mode eager --attention sdpa || true
    torch_gpt torch_gpt_eager_naive 90 --model gpt2-small --mode eager --attention naive || true
    if ((small)); then
      torch_gpt torch_gpt_small_eager 90 --model gpt2-6L --mode eager --attention sdpa || true
    fi
    torch_gpt torch_gpt_compile 240 --model gpt2-small --mode compile --attention sdpa || true
  fi
  # Last, with what is left: the kernel suites under compute-sanitizer's memcheck, which sees an
  # out-of-bounds or misaligned access that a passing comparison may not (KINDS.md: it runs on
  # the Firecracker machines and is refused on gVisor). A finding fails this phase, not the run.
  local sanitizer=$toolkit/bin/compute-sanitizer
  [[ -x $sanitizer ]] || sanitizer=$(command -v compute-sanitizer || true)
  if [[ -n $sanitizer && -d $build/tests ]]; then
    phase memcheck-kernels 120 - bash -c '
      sanitizer=$1 found=0
      for test in "$2"/tests/kernels_*_cuda_test; do
        [[ -x $test ]] || continue
        echo "memcheck: ${test##*/}"
        "$sanitizer" --tool memcheck --error-exitcode 3 --print-limit 20 "$test" \
          --gtest_brief=1 || found=1
      done
      exit "$found"' memcheck "$sanitizer" "$build" || true
  fi

  # The summary; without python3, the phases alone.
  if ! "${python[@]}" tools/reference/gpu_report.py "$out" >"$out/report.md"; then
    { echo "# gpu-check report (phases only: gpu_report.py failed)"; echo
      printf '%s\n' "| phase | exit status | seconds | note |" "| --- | --- | --- | --- |"
      sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$phases"; } >"$out/report.md"
  fi
  cat "$out/report.md"  # last, where the device tool's output tail shows it
  # The benchmarks' raw output as one archive (the device tool brings back at most 8 files).
  local raw=() file
  for file in "$out"/adamw_cuda_bench.json "$out"/gpt_cuda_bench_*.json "$out"/torch_*.jsonl; do
    [[ -f $file ]] && raw+=("${file##*/}")
  done
  if ((${#raw[@]} > 0)) && tar -C "$out" -czf "$out/results.tar.gz" "${raw[@]}"; then
    (cd "$out" && rm -f "${raw[@]}")
  fi
  echo "gpu-check: done in ${SECONDS}s, exit status $status; summary $out/report.md," \
       "raw results $out/results.tar.gz"
  exec >&3 2>&4 3>&- 4>&-
  local tick
  for tick in {1..20}; do
    kill -0 "$tee_pid" 2>/dev/null || break
    sleep 0.25
  done
  return "$status"
}

case $mode in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: tools/gpu-check.sh [prepare|run]" >&2; exit 2 ;;
esac
