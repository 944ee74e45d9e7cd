#!/usr/bin/env bash
# Builds zest with nvcc and runs the gpu-labelled tests (`ctest -L gpu`) on a machine with a GPU
# and the CUDA toolkit but without the Debian -dev packages zest builds with (and no network).
#
#   tools/gpu-check.sh prepare   on a Debian machine with the packages (`make deps`): copies the
#                                host dependencies zest needs into .gpu-deps/ (git-ignored,
#                                about 45 MiB), to carry to the GPU machine with the tree
#   tools/gpu-check.sh [run]     on the GPU machine: configures build-gpu/ against .gpu-deps/
#                                (where present, else the system's packages), builds libzest and
#                                the gpu-labelled suites only, runs them, and writes the log and a
#                                JUnit report under $OUT (or build-gpu/gpu-check/)
#
# Note: the dependencies are the prepared machine's own Debian files (headers, CMake packages,
# GoogleTest's static libraries, and the shared libraries libzest links: fmt, xxhash, OpenBLAS
# with libgfortran), not sources built there: OpenBLAS would take longer to build than the check
# itself. Debian 12's libraries need glibc 2.36, so the GPU machine needs glibc 2.36 or later.
# Warnings are not errors there (another host compiler may warn differently); CI holds -Werror.
# Environment: ZEST_GPU_BUILD_DIR (build-gpu), ZEST_CUDA_ARCHS (90), JOBS (nproc), OUT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

deps=.gpu-deps
mode=${1:-run}

prepare() {
  command -v dpkg >/dev/null || { echo "gpu-check: prepare needs dpkg (Debian)" >&2; exit 1; }
  local packages=(nlohmann-json3-dev libfmt-dev libfmt9 libgtest-dev libgmock-dev libcli11-dev
                  libxxhash-dev libxxhash0 libopenblas-dev libopenblas-pthread-dev
                  libopenblas0-pthread libgfortran5 libquadmath0)
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
  echo "gpu-check: $(du -sh "$deps" | cut -f1) of dependencies in $deps/;" \
       "carry it to the GPU machine"
}

run() {
  local build=${ZEST_GPU_BUILD_DIR:-build-gpu}
  local out=${OUT:-$build/gpu-check}
  local jobs=${JOBS:-$(nproc)}
  mkdir -p "$out" "$build"
  local log="$out/gpu-check.log"
  : >"$log"
  exec > >(tee -a "$log") 2>&1

  local nvcc=${CUDACXX:-}
  [[ -z $nvcc ]] && nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  echo "gpu-check: $(uname -srm), $jobs jobs, nvcc $("$nvcc" --version | tail -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

  local configure=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEST_CUDA=ON
                   -DCMAKE_CUDA_COMPILER="$nvcc" -DZEST_CUDA_ARCHS="${ZEST_CUDA_ARCHS:-90}"
                   -DZEST_MPI=OFF -DZEST_BENCHMARKS=OFF -DZEST_WERROR=OFF)
  if [[ -d $deps ]]; then
    local root=$PWD/$deps/usr lib=$PWD/$deps/usr/lib/x86_64-linux-gnu
    configure+=(-DCMAKE_PREFIX_PATH="$root"
                -Dnlohmann_json_DIR="$root/share/cmake/nlohmann_json"
                -DCLI11_DIR="$root/share/cmake/CLI11"
                -Dfmt_DIR="$lib/cmake/fmt" -DGTest_DIR="$lib/cmake/GTest"
                -DZEST_XXHASH_INCLUDE_DIR="$root/include" -DZEST_XXHASH_LIBRARY="$lib/libxxhash.so"
                -DZEST_CBLAS_INCLUDE_DIR="$root/include/x86_64-linux-gnu/openblas-pthread"
                -DZEST_OPENBLAS_LIBRARY="$lib/openblas-pthread/libopenblas.so")
    # The test programs run at build time (test discovery) and under ctest: both find the
    # carried libraries here.
    export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  cmake "${configure[@]}"

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
  echo "gpu-check: building ${targets[*]}"
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"

  local status=0
  ctest --test-dir "$build" -L gpu --output-on-failure --timeout 300 \
        --output-junit "$(cd "$out" && pwd)/ctest-gpu.xml" || status=$?
  echo "gpu-check: ctest -L gpu exited with $status; log $log, report $out/ctest-gpu.xml"
  return "$status"
}

case $mode in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: tools/gpu-check.sh [prepare|run]" >&2; exit 2 ;;
esac
