#!/usr/bin/env bash
# Installs the Debian packages zest builds with. A fast no-op when they are all present (one
# `dpkg -s` each); otherwise one `apt-get install` of the missing ones, retried once after
# `apt-get update`. Uses sudo only when not root. On a system without dpkg it prints the list.
#   tools/setup/install-deps.sh            what the build and `make train` need
#   tools/setup/install-deps.sh browser    that, and chromium for the browser-labelled tests
#                                          (`make test`, `make test-browser`)
set -euo pipefail

# clang and libclang-rt-dev (libFuzzer and clang's sanitizer runtimes) build `make fuzz`; llvm
# brings llvm-symbolizer, which turns sanitizer reports' addresses into file:line.
packages=(
  cmake ninja-build g++
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libopenmpi-dev openmpi-bin libopenblas-dev
  libcli11-dev libfmt-dev libxxhash-dev liburing-dev
  clang libclang-rt-dev llvm
  libjs-chart.js
)
# libjs-chart.js: Chart.js, compiled into the tools to draw their HTML pages
# (cmake/EmbedChartJs.cmake). chromium opens those pages in the browser tests; it is large, so
# only the `browser` group (what `make test` asks for) installs it.
for group in "$@"; do
  case "$group" in
    browser) packages+=(chromium) ;;
    *) echo "install-deps: unknown group '$group' (known: browser)" >&2; exit 2 ;;
  esac
done

if ! command -v dpkg >/dev/null 2>&1; then
  echo "install-deps: no dpkg here; install the equivalents of: ${packages[*]}" >&2
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  # Note: `dpkg -s` also succeeds for a removed package whose config files remain, so the
  # status line is checked, not just the exit code.
  if ! dpkg -s "$package" 2>/dev/null | grep -q '^Status: install ok installed'; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "install-deps: missing ${missing[*]}, and not root without sudo; install them as root" >&2
    exit 1
  fi
fi

apt_install() {
  ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

echo "install-deps: installing ${missing[*]}"
if ! apt_install; then
  echo "install-deps: install failed; running apt-get update and retrying once"
  ${sudo[@]+"${sudo[@]}"} apt-get update
  apt_install
fi
