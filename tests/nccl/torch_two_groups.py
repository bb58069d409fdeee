"""Two process groups of the same 2 ranks used at once on two CUDA streams, tensor-parallel style.

What it tests: group A is the default (data-parallel) group, group B a second group made with
dist.new_group over the same ranks, so each rank has two communicators on its GPU. Each
iteration issues, without waiting on the host:
  stream A: fill a (2n floats), all_reduce(a) on group A, check a, record event "a ready";
  stream B: fill g (n floats), all_gather_into_tensor on group B, check it; then wait "a ready",
            r = a * (rank + 1), record event "a read", reduce_scatter_tensor(r) on group B, check;
  and stream A waits "a read" before it refills a in the next iteration.
So group A's all_reduce of one iteration runs beside group B's all_gather and reduce_scatter of
the neighbouring ones, and the reduce_scatter's input depends across streams on the all_reduce's
output, as FSDP's and tensor parallelism's event chains do. Every value is a small integer held
in float32, so sums are exact and each result is compared element by element with the value
computed locally on the same stream; the wrong elements are counted on the GPU and read once at
the end. The default size (1 Mi elements, 4-8 MiB per tensor) and 300 iterations keep the
kernels of both groups overlapping. Exit status non-zero if any element is wrong on any rank.

  python3 torch_two_groups.py --out nccl.json                              # NVIDIA's NCCL
  LD_PRELOAD=/path/to/coccl/libnccl.so.2 python3 torch_two_groups.py --out coccl.json
  python3 torch_two_groups.py --compare nccl.json coccl.json    # both clean, same work done

run_torch.sh beside this file does all three (and handles one GPU). Rank r runs on GPU
r % device_count: with one GPU both ranks share it, where NVIDIA's NCCL needs --hostid-per-rank
(and MPS, see run_torch.sh). Exit 77: no GPU. Tolerance: none, results must be exact.
Not part of the product: a test asset.
"""
import datetime
import json
import sys

import torch
import torch.distributed as dist
from torch_ranks import WORLD, join, loaded_nccl, main

# sum over ranks r of (r + 1): what an all_reduce / reduce_scatter of x * (rank + 1) multiplies by.
RANK_SUM = WORLD * (WORLD + 1) // 2


def setup(rank, args):
    # The default communicator is made at once, so new_group is an ncclCommSplit of it.
    return join(rank, args, 29520, bind_device=True, timeout=datetime.timedelta(seconds=180))


def base(idx, i):
    # Values 1..1000, shifted each iteration so that a stale buffer never passes for a fresh one.
    return (idx + i) % 1000 + 1


def run(rank, args):
    dev = setup(rank, args)
    group_a = dist.group.WORLD
    group_b = dist.new_group(list(range(WORLD)))
    n = args.elems
    stream_a = torch.cuda.Stream()
    stream_b = torch.cuda.Stream()
    idx = torch.arange(WORLD * n, dtype=torch.int64, device=dev)
    first = idx[:n]
    a = torch.empty(WORLD * n, device=dev)
    g_in = torch.empty(n, device=dev)
    g_out = torch.empty(WORLD * n, device=dev)
    r_out = torch.empty(n, device=dev)
    wrong = {name: torch.zeros((), dtype=torch.int64, device=dev)
             for name in ("all_reduce", "all_gather", "reduce_scatter")}
    # The buffers above were made on the default stream.
    stream_a.wait_stream(torch.cuda.current_stream())
    stream_b.wait_stream(torch.cuda.current_stream())
    a_ready = torch.cuda.Event()
    a_read = torch.cuda.Event()
    for i in range(args.iters):
        with torch.cuda.stream(stream_a):
            if i > 0:
                stream_a.wait_event(a_read)
            want_a = (base(idx, i) * RANK_SUM).float()
            a.copy_(base(idx, i) * (rank + 1))
            dist.all_reduce(a, group=group_a)
            wrong["all_reduce"] += (a != want_a).sum()
            a_ready.record(stream_a)
        with torch.cuda.stream(stream_b):
            g_in.copy_((first + 7 * i) % 1009 + 2000 * rank)
            dist.all_gather_into_tensor(g_out, g_in, group=group_b)
            want_g = ((idx % n + 7 * i) % 1009 + 2000 * (idx // n)).float()
            wrong["all_gather"] += (g_out != want_g).sum()
            stream_b.wait_event(a_ready)
            r_in = a * (rank + 1)
            a_read.record(stream_b)
            dist.reduce_scatter_tensor(r_out, r_in, group=group_b)
            want_r = (base(first + rank * n, i) * RANK_SUM * RANK_SUM).float()
            wrong["reduce_scatter"] += (r_out != want_r).sum()
    torch.cuda.synchronize()
    counts = torch.stack([wrong[k] for k in sorted(wrong)])
    mine = dict(zip(sorted(wrong), counts.tolist()))
    print(f"rank {rank} on {dev}: {args.iters} iterations of {n} elements; wrong elements: "
          + ", ".join(f"{k} {v}" for k, v in mine.items()), flush=True)
    dist.all_reduce(counts)
    total = dict(zip(sorted(wrong), counts.tolist()))
    dist.destroy_process_group()
    if rank == 0:
        checked = {"all_reduce": args.iters * WORLD * n, "all_gather": args.iters * WORLD * n,
                   "reduce_scatter": args.iters * n}
        result = {"iters": args.iters, "elems": n, "wrong": total, "checked_per_rank": checked,
                  "libnccl": loaded_nccl(), "torch": torch.__version__,
                  "gpus": torch.cuda.device_count()}
        with open(args.out, "w") as f:
            json.dump(result, f)
        print(f"all ranks, wrong elements: {total} -> {args.out}", flush=True)
    if any(total.values()):
        sys.exit(1)


def compare(a_path, b_path):
    runs = [(path, json.load(open(path))) for path in (a_path, b_path)]
    status = 0
    for path, r in runs:
        print(f"{path}: {r['iters']} iterations of {r['elems']} elements, wrong {r['wrong']}")
        if any(r["wrong"].values()):
            status = 1
    (_, x), (_, y) = runs
    if (x["iters"], x["elems"]) != (y["iters"], y["elems"]):
        print("the runs did different work")
        status = 1
    if status == 0:
        print("TWO_GROUPS_MATCH")
    return status


def add_arguments(parser):
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--elems", type=int, default=1 << 20, help="n: elements per rank")


if __name__ == "__main__":
    main(__doc__, run, lambda a, b, args: compare(a, b), add_arguments)
