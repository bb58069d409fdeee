#!/usr/bin/env bash
# Runs one of the PyTorch test scripts beside this file twice in one job, on NVIDIA's NCCL (the
# libnccl.so.2 that PyTorch ships, no LD_PRELOAD) and on coccl's (LD_PRELOAD), then has the
# script compare the two runs:
#
#   run_torch.sh [--across-hosts] /path/to/coccl/libnccl.so.2 torch_fsdp.py [script arguments]
#
# --across-hosts: every rank acts as a host of its own in the coccl run too (NCCL_HOSTID per rank),
# so that coccl takes its path across hosts (staging kernels and the network proxy).
#
# A script takes --out JSON (one run, 2 ranks spawned by torch.multiprocessing) and
# --compare JSON JSON; the script arguments go to all three calls. A relative script name is
# looked up beside this file. $PYTHON (default python3) is the interpreter with torch.
#
# With 2 or more GPUs rank r runs on cuda:r. With one GPU both ranks share cuda:0: the MPS daemon
# is started if none runs (and stopped at the end only if this script started it), because
# without it the two processes' spinning kernels time-slice at 2-5 ms per operation; and the NCCL
# run gets --hostid-per-rank (NCCL_HOSTID=host<rank>), since NVIDIA's NCCL refuses two ranks on
# one GPU of one host otherwise: it then sends its traffic over its socket transport on loopback,
# slower and as good a baseline for correctness.
#
# Exit status: 0 both runs passed and agree; 77 skipped (no torch, no CUDA, no GPU, or a torch
# that links NCCL statically so that LD_PRELOAD cannot replace it); 1 otherwise.
# Not part of the product: a test asset.
set -u

coccl_args=()
if [[ ${1:-} == --across-hosts ]]; then
  coccl_args=(--hostid-per-rank)
  shift
fi
if (($# < 2)); then
  echo "usage: $0 [--across-hosts] COCCL_LIBNCCL_SO SCRIPT [SCRIPT ARGS...]" >&2
  exit 2
fi
lib=$(realpath -m "$1")
script=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $script == */* ]] || script=$here/$script
py=${PYTHON:-python3}
[[ -f $script ]] || { echo "no such script: $script" >&2; exit 1; }

gpus=$(env -u LD_PRELOAD "$py" - <<'EOF'
import sys
try:
    import torch
except Exception as e:
    print(f"skipped: torch is not importable ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: torch.cuda.is_available() is false")
    sys.exit(77)
if torch.cuda.device_count() < 1:
    print("skipped: no GPU")
    sys.exit(77)
print(torch.cuda.device_count())
EOF
)
rc=$?
if ((rc == 77)); then
  echo "$gpus"
  exit 77
elif ((rc != 0)); then
  echo "$gpus"
  echo "the torch probe failed ($rc)" >&2
  exit 1
fi
gpus=${gpus##*$'\n'}
[[ -f $lib ]] || { echo "no such library: $lib" >&2; exit 1; }
echo "$script on $gpus GPU(s), coccl: $lib"

tmp=$(mktemp -d)
started_mps=0
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  if ((started_mps)); then
    echo quit | nvidia-cuda-mps-control
    echo "stopped the MPS daemon"
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mps_daemon_running() {
  # comm is cut to 15 characters, so match argv[0] from cmdline.
  local f argv0
  for f in /proc/[0-9]*/cmdline; do
    argv0=
    { IFS= read -r -d '' argv0 < "$f"; } 2>/dev/null
    [[ ${argv0##*/} == nvidia-cuda-mps-control ]] && return 0
  done
  return 1
}

nccl_args=()
nccl_env=()
if ((gpus == 1)); then
  nccl_args=(--hostid-per-rank)
  # Keep NVIDIA's NCCL on sockets over loopback, whatever network cards the machine has.
  nccl_env=(NCCL_IB_DISABLE=1 "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}")
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "warning: no nvidia-cuda-mps-control: the two ranks time-slice the GPU (slow)"
  elif mps_daemon_running; then
    echo "an MPS daemon is running: using it"
  elif nvidia-cuda-mps-control -d; then
    started_mps=1
    echo "started the MPS daemon"
  else
    echo "warning: could not start the MPS daemon: the two ranks time-slice the GPU (slow)"
  fi
fi

free_port() {
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port_nccl=$(free_port)
port_coccl=$(free_port)
while [[ $port_coccl == "$port_nccl" ]]; do port_coccl=$(free_port); done

status=0
echo "== NVIDIA NCCL (MASTER_PORT=$port_nccl)"
start=$SECONDS
env -u LD_PRELOAD ${nccl_env[@]+"${nccl_env[@]}"} MASTER_ADDR=127.0.0.1 MASTER_PORT="$port_nccl" \
  NCCL_NVLS_ENABLE=0 "$py" "$script" --out "$tmp/nccl.json" ${nccl_args[@]+"${nccl_args[@]}"} "$@"
rc=$?
echo "== NVIDIA NCCL: exit $rc in $((SECONDS - start)) s"
((rc == 77)) && exit 77
((rc != 0)) && status=1

echo "== coccl (LD_PRELOAD=$lib, MASTER_PORT=$port_coccl)"
start=$SECONDS
env LD_PRELOAD="$lib" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port_coccl" NCCL_NVLS_ENABLE=0 \
  "$py" "$script" --out "$tmp/coccl.json" ${coccl_args[@]+"${coccl_args[@]}"} "$@"
rc=$?
echo "== coccl: exit $rc in $((SECONDS - start)) s"
((rc == 77)) && exit 77
((rc != 0)) && status=1

if ((status != 0)); then
  echo "FAILED: a run did not pass"
  exit 1
fi

# Each run recorded the libnccl files mapped in rank 0: the runs must have used the two libraries.
env -u LD_PRELOAD "$py" - "$tmp/nccl.json" "$tmp/coccl.json" "$lib" <<'EOF'
import json, os, sys
nccl_json, coccl_json, lib = sys.argv[1:]
nccl = [os.path.realpath(p) for p in json.load(open(nccl_json)).get("libnccl", [])]
coccl = [os.path.realpath(p) for p in json.load(open(coccl_json)).get("libnccl", [])]
print(f"NVIDIA run loaded {nccl}; coccl run loaded {coccl}")
if not nccl:
    print("skipped: this torch does not load libnccl.so.2 (NCCL linked statically?), so "
          "LD_PRELOAD cannot replace it")
    sys.exit(77)
if lib in nccl:
    print("FAILED: the NVIDIA NCCL run loaded coccl's library")
    sys.exit(1)
if lib not in coccl:
    print("FAILED: the coccl run did not load coccl's library")
    sys.exit(1)
EOF
rc=$?
((rc != 0)) && exit "$rc"

env -u LD_PRELOAD "$py" "$script" --compare "$tmp/nccl.json" "$tmp/coccl.json" "$@"
rc=$?
((rc != 0)) && { echo "FAILED: the runs disagree"; exit 1; }
echo "PASSED"
exit 0
