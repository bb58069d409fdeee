#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, then builds and runs a consumer project against it
# with find_package(coccl). Arguments: build dir, source dir of the consumer, scratch dir.
# The installed package must export coccl::coccl alone and must not pin consumers to one exact
# Boost version.
set -euo pipefail
build=$1 consumer=$2 scratch=$3
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" > "$scratch.install.log" 2>&1 || {
  cat "$scratch.install.log"; exit 1; }
config_dir=$(dirname "$(find "$scratch/prefix" -name cocclConfig.cmake)")
exported=$(grep -ho 'add_library([^ ]*' "$config_dir"/cocclTargets.cmake | sort -u | tr '\n' ' ')
if [ "$exported" != "add_library(coccl::coccl " ]; then
  echo "check_install: the package exports ${exported}; only coccl::coccl may be exported" >&2
  exit 1
fi
if grep -n 'EXACT' "$config_dir"/cocclConfig.cmake; then
  echo "check_install: cocclConfig.cmake asks for an exact dependency version" >&2
  exit 1
fi
cmake -S "$consumer" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release
cmake --build "$scratch/build"
"$scratch/build/consumer"
