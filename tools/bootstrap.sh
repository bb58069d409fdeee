#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds coccl and runs the main job or the tests.
#
#   tools/bootstrap.sh perf [coccl-perf args]   install, build, run coccl-perf (default sweep)
#   tools/bootstrap.sh test                     install, check the formatting, build, run every
#                                               test, then the ASan+UBSan build's tests and a
#                                               short run of every fuzz target (libFuzzer, both
#                                               clang), then the TSan build's multi-rank tests
#
# Build trees: build/ (release), build-asan/ (ASan+UBSan and the fuzz targets) and build-tsan/.
# COCCL_SKIP_SANITIZER=1 skips the ASan+UBSan tests, COCCL_SKIP_FUZZ=1 the fuzz targets (with
# both, no build-asan/), COCCL_SKIP_TSAN=1 the TSan tree. Each stage prints how long it took.
set -euo pipefail

mode=${1:-perf}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)

# qemu-system-x86 and xz-utils: the rdma_guest test boots a Soft-RoCE guest (tests/rdma);
# gnuplot-nox draws coccl-perf --plot; clang-14, libclang-rt-14-dev (libFuzzer and the sanitizer
# runtimes) and llvm-14 (llvm-symbolizer) build and run the fuzz targets (tests/fuzz);
# clang-format-14 checks the formatting (.clang-format).
packages=(cmake ninja-build g++ pkg-config libboost1.81-dev liburing-dev libibverbs-dev rdma-core
  googletest libgtest-dev libbenchmark-dev libgloo-dev libopenmpi-dev openmpi-bin
  qemu-system-x86 xz-utils gnuplot-nox clang-14 libclang-rt-14-dev llvm-14 clang-format-14)
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

build() {  # build DIR "TARGETS" [cmake args]; TARGETS empty: every target
  local dir=$1 targets=$2
  shift 2
  mkdir -p "$dir"
  cmake -S "$root" -B "$dir" -G Ninja "$@" > "$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log"
    return 1
  }
  # shellcheck disable=SC2086 # TARGETS is a list
  cmake --build "$dir" -j "$jobs" ${targets:+--target $targets}
}

# The multi-rank tests the TSan stage runs (a ctest -R regular expression). EveryCollective over
# tcp is left out: Engines/TcpEngine.EveryCollectiveWithThreeRanks runs that scenario on each tcp
# engine (the default picks one of them), and Engines/TcpEngine.AllReduceWithFourRanksSmallSlots-
# AndThreeSockets four ranks with small slots on each (the four-rank every-collective run took
# 32 s under TSan, for the same threads).
tsan_tests='^(EveryCollective\.OverShmWithThree|(Cancellation|Abort|Status|Shrink|Ranks/Async|Transports/KilledRank|Engines/TcpEngine|TcpEngineFallback|Transports/Links|Links/FastPath|Links/FastPathHandover|ProxyThreadBorrow|MemoryVirtualTime)[./])'

# The sanitizer trees keep assertions and line tables but compile at -O1, as the ASan and TSan
# documentation advises: at -O0 the ASan tests took up to 2.6 times as long (the tcp striping
# test 120 s against 46 s, EveryCollective over tcp with small slots 108 s against 53 s). Line
# tables (clang's -gline-tables-only, GCC's -g1) are all a sanitizer report needs for its stacks;
# full debug information made collectives/comm.cpp take 22.6 s against 18.3 (clang, ASan) and
# 15.2 s against 11.5 (GCC, TSan).
asan_opt=(-DCMAKE_CXX_FLAGS_DEBUG="-gline-tables-only -O1" -DCMAKE_C_FLAGS_DEBUG="-gline-tables-only -O1")
tsan_opt=(-DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" -DCMAKE_C_FLAGS_DEBUG="-g1 -O1")

stage_start=$SECONDS
stage_done() {  # stage_done NAME: prints the time since the previous stage ended
  echo "bootstrap: stage $1 took $((SECONDS - stage_start)) s"
  stage_start=$SECONDS
}

# Every C, C++ and CUDA source as clang-format-14 writes it; prints the difference and fails.
check_format() {
  local files diff_out="" f
  if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    mapfile -t files < <(git -C "$root" ls-files -- '*.c' '*.h' '*.cpp' '*.hpp' '*.cu' '*.cuh')
  else
    mapfile -t files < <(cd "$root" && find . -path './build*' -prune -o -type f \
      \( -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' \
      -o -name '*.cuh' \) -print)
  fi
  for f in "${files[@]}"; do
    diff_out+=$(cd "$root" && clang-format-14 --style=file "$f" | diff -u "$f" - \
      --label "$f" --label "$f (clang-format-14)") || true
  done
  if [ -n "$diff_out" ]; then
    printf '%s\n' "$diff_out"
    echo "bootstrap: these files are not formatted as .clang-format says (clang-format-14 -i)" >&2
    return 1
  fi
  # g++ 12 miscompiles a co_await inside an operand of && or || (a coroutine frame is resumed in
  # a state it never reached: SIGILL): each co_await stays a statement of its own.
  local joined
  joined=$(cd "$root" && grep -nE '(&&|\|\|)[[:space:]]*co_await|co_await[^;{]*(&&|\|\|)' \
    "${files[@]}" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//') || true
  if [ -n "$joined" ]; then
    printf '%s\n' "$joined"
    echo "bootstrap: co_await inside && or || (g++ 12 miscompiles it): split the condition" >&2
    return 1
  fi
}

if [ "$mode" = test ]; then
  check_format
  stage_done format
fi
# coccl_sim runs 4096 ranks in one process here (about 35 s and 2.1 GB on the 2-core machine).
# When the fuzz stage below runs, it replays every fuzz corpus under ASan+UBSan, so the release
# tree leaves the fuzz targets out (8 programs, about 50 s of this machine's two cores).
replay=ON
if [ "$mode" = test ] && [ "${COCCL_SKIP_FUZZ:-0}" != 1 ]; then replay=OFF; fi
# Device code is SASS for sm_90 (and its PTX), except in a test run on a machine without a GPU
# (CI): nothing runs the kernels there, so they compile to PTX only and ptxas, 30 of the 69 s that
# nvcc takes over kernels/all_reduce.cu, is skipped. A GPU that appears later JIT-compiles the PTX.
cuda_arch=90
if [ "$mode" = test ] && ! nvidia-smi -L > /dev/null 2>&1; then cuda_arch=90-virtual; fi
# The Gloo peer of coccl-perf (56 s of compile) is built for the main job only: no test runs it.
gloo=ON
[ "$mode" != test ] || gloo=OFF
build "$root/build" "" -DCMAKE_BUILD_TYPE=Release -DCOCCL_SIM_RANKS=4096 -DCOCCL_FUZZ_REPLAY=$replay \
  -DCMAKE_CUDA_ARCHITECTURES=$cuda_arch -DCOCCL_GLOO_BASELINE=$gloo
stage_done release-build

case "$mode" in
  perf)
    exec "$root/build/tools/coccl-perf" "$@"
    ;;
  test)
    ctest --test-dir "$root/build" -j "$jobs" --output-on-failure --timeout 600
    stage_done release-tests
    if [ "${COCCL_SKIP_SANITIZER:-0}" != 1 ] || [ "${COCCL_SKIP_FUZZ:-0}" != 1 ]; then
      # ASan+UBSan over the host code, built by clang: GCC's UBSan made collectives/comm.cpp take
      # 43.7 s against clang's 18.3 (CUDA off: the GPU tests skip here anyway; no tools). The
      # same tree links the fuzz targets with libFuzzer (COCCL_FUZZ), so the libraries compile
      # once for both.
      fuzz=ON
      [ "${COCCL_SKIP_FUZZ:-0}" != 1 ] || fuzz=OFF
      # Each fuzz target fuzzes 6 s after replaying its corpus (COCCL_FUZZ_SECONDS, 10 by
      # default): eight targets on two cores, 30 s of the run.
      build "$root/build-asan" "" -DCMAKE_BUILD_TYPE=Debug -DCOCCL_SANITIZE=address \
        -DCOCCL_FUZZ=$fuzz -DCOCCL_FUZZ_SECONDS=6 -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 \
        -DCOCCL_ENABLE_CUDA=OFF -DCOCCL_BUILD_TOOLS=OFF "${asan_opt[@]}"
      stage_done asan-build
      if [ "${COCCL_SKIP_SANITIZER:-0}" != 1 ]; then
        # The 8-rank instances of the rank sweeps are left to the release tree: they take the
        # same code paths as 4 ranks (powers of two; 3, 5 and 6 ranks cover the others) at twice
        # the processes, on two cores.
        ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 COCCL_CHAOS_TRIALS=8 \
          ctest --test-dir "$root/build-asan" -LE '^fuzz$' -j "$jobs" --output-on-failure \
          --timeout 900 -E '^(Ranks|Forced)/.*[/_]8ranks( |$)'
        stage_done asan-tests
      fi
      if [ "$fuzz" = ON ]; then
        # Each fuzz target for COCCL_FUZZ_SECONDS over its corpus (tests/fuzz/corpus).
        ctest --test-dir "$root/build-asan" -L '^fuzz$' -j "$jobs" --output-on-failure
        stage_done fuzz-tests
      fi
    fi
    if [ "${COCCL_SKIP_TSAN:-0}" != 1 ]; then
      # TSan over the multi-rank tests where the proxy threads, the user's threads and the
      # communicator's shutdown meet: every collective on each transport and tcp engine, async
      # and cancelled operations, aborts, killed ranks, shrink, status queries, link closes and
      # a communicator whose creation fails on its proxy thread, and the fast path of small
      # operations (callers borrowing the proxy thread's role).
      # The sweeps over ranks, types and algorithms run only in the two builds above (TSan runs
      # them 5 to 15 times slower). Only those programs are built, engine_test for the threads
      # that borrow the proxy thread's role (ProxyThreadBorrow), and memory_traffic_test for
      # virtual time over two proxy threads (coccl-sim's).
      build "$root/build-tsan" "multirank_test coccl_worker engine_test memory_traffic_test" \
        -DCMAKE_BUILD_TYPE=Debug \
        -DCOCCL_SANITIZE=thread -DCOCCL_ENABLE_CUDA=OFF -DCOCCL_BUILD_TOOLS=OFF "${tsan_opt[@]}"
      stage_done tsan-build
      TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
        ctest --test-dir "$root/build-tsan" -L '^(multirank_test|engine_test|memory_traffic_test)$' \
        -j "$jobs" --output-on-failure --timeout 900 -R "$tsan_tests"
      stage_done tsan-tests
    fi
    ;;
  *)
    echo "usage: $0 perf [coccl-perf args] | test" >&2
    exit 2
    ;;
esac
