"""What the PyTorch test scripts beside this file share: joining the job as one of two ranks, the
list of libnccl files the process loaded, and the command line (--out RUN.json to run, --compare
A.json B.json to compare two runs, --hostid-per-rank for NVIDIA's NCCL with two ranks on one GPU).

Not part of the product: a test asset.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def loaded_nccl():
    """The libnccl files mapped into this process (which library the run really used)."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "libnccl" in line})


def join(rank, args, port, bind_device=False, **init):
    """Makes this process rank `rank` of WORLD on GPU rank % GPUs and returns that device.
    bind_device passes it as init_process_group's device_id (the default communicator is made at
    once, so new_group splits it); `init` goes to init_process_group as well."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    if args.hostid_per_rank:
        # NVIDIA's NCCL refuses two ranks on one GPU of one host; distinct host ids make it take
        # its network path between them.
        os.environ["NCCL_HOSTID"] = f"host{rank}"
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    if bind_device:
        init["device_id"] = dev
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, **init)
    return dev


def main(doc, run, compare, add_arguments=None):
    """The scripts' entry point: run(rank, args) on WORLD spawned ranks for --out, or exit with
    compare(a_path, b_path, args) for --compare; 77 (skipped) without a GPU."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", help="where rank 0 writes the run (JSON)")
    parser.add_argument("--compare", nargs=2, metavar="JSON", help="compare two runs")
    parser.add_argument("--hostid-per-rank", action="store_true",
                        help="NCCL_HOSTID=host<rank> (NVIDIA's NCCL with two ranks on one GPU)")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare, args))
    if not args.out:
        parser.error("--out or --compare is required")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print("needs a GPU: skipped")
        sys.exit(77)
    mp.spawn(run, args=(args,), nprocs=WORLD, join=True)
