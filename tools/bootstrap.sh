#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds coccl and runs the main job or the tests.
#
#   tools/bootstrap.sh perf [coccl-perf args]   install, build, run coccl-perf (default sweep)
#   tools/bootstrap.sh test                     install, build, run every test, then the
#                                               ASan+UBSan build's tests, then a short run of
#                                               every fuzz target (libFuzzer, clang)
#
# Build trees: build/ (release), build-asan/ and build-fuzz/. COCCL_SKIP_SANITIZER=1 skips the
# second, COCCL_SKIP_FUZZ=1 the third.
set -euo pipefail

mode=${1:-perf}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)

# qemu-system-x86 and xz-utils: the rdma_guest test boots a Soft-RoCE guest (tests/rdma);
# gnuplot-nox draws coccl-perf --plot; clang-14, libclang-rt-14-dev (libFuzzer and the sanitizer
# runtimes) and llvm-14 (llvm-symbolizer) build and run the fuzz targets (tests/fuzz).
packages=(cmake ninja-build g++ pkg-config libboost1.81-dev liburing-dev libibverbs-dev rdma-core
  googletest libgtest-dev libbenchmark-dev libgloo-dev libopenmpi-dev openmpi-bin
  qemu-system-x86 xz-utils gnuplot-nox clang-14 libclang-rt-14-dev llvm-14)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" > /dev/null
fi

build() {  # build DIR [cmake args]
  local dir=$1
  shift
  cmake -S "$root" -B "$dir" -G Ninja "$@" > "$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log"
    return 1
  }
  cmake --build "$dir" -j "$jobs"
}

mkdir -p "$root/build"
build "$root/build" -DCMAKE_BUILD_TYPE=Release

case "$mode" in
  perf)
    exec "$root/build/tools/coccl-perf" "$@"
    ;;
  test)
    ctest --test-dir "$root/build" -j "$jobs" --output-on-failure --timeout 600
    if [ "${COCCL_SKIP_SANITIZER:-0}" != 1 ]; then
      # One sanitizer build in CI: ASan+UBSan over the host code (CUDA off: the GPU tests skip
      # here anyway, and it halves the build).
      mkdir -p "$root/build-asan"
      build "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DCOCCL_SANITIZE=address \
        -DCOCCL_ENABLE_CUDA=OFF -DCOCCL_BUILD_TOOLS=OFF
      ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 COCCL_CHAOS_TRIALS=8 \
        ctest --test-dir "$root/build-asan" -j "$jobs" --output-on-failure --timeout 900
    fi
    if [ "${COCCL_SKIP_FUZZ:-0}" != 1 ]; then
      # Each fuzz target for COCCL_FUZZ_SECONDS over its corpus (tests/fuzz/corpus).
      mkdir -p "$root/build-fuzz"
      build "$root/build-fuzz" -DCOCCL_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-14 \
        -DCMAKE_C_COMPILER=clang-14
      ctest --test-dir "$root/build-fuzz" -L fuzz -j "$jobs" --output-on-failure
    fi
    ;;
  *)
    echo "usage: $0 perf [coccl-perf args] | test" >&2
    exit 2
    ;;
esac
