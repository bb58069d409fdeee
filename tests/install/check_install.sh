#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, then builds and runs a consumer project against it
# with find_package(coccl). Arguments: build dir, source dir of the consumer, scratch dir.
set -euo pipefail
build=$1 consumer=$2 scratch=$3
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" > "$scratch.install.log" 2>&1 || {
  cat "$scratch.install.log"; exit 1; }
cmake -S "$consumer" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release
cmake --build "$scratch/build"
"$scratch/build/consumer"
