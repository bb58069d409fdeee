"""torch.distributed's "nccl" backend on whichever libnccl.so.2 the process loads.

Run on a host with 2 GPUs, on coccl:  LD_PRELOAD=/path/to/coccl/libnccl.so.2 python3 torch_smoke.py
and on NVIDIA's NCCL without LD_PRELOAD. Every collective's result is checked against a value
computed on the host; the exit code is 0 only if all match. Not part of the product: a test asset.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def loaded_nccl():
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libnccl" in line}
    return sorted(paths)


def check(name, got, want):
    if not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"{name}: got {got.cpu().tolist()[:8]}, want {want.cpu().tolist()[:8]}")
    print(f"rank {dist.get_rank()}: {name} ok", flush=True)


def run(rank):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    # device_id makes the communicator at init, so new_group below is an ncclCommSplit.
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=dev)
    if rank == 0:
        print("libnccl:", loaded_nccl(), "nccl version", torch.cuda.nccl.version(), flush=True)
    n = 1 << 20

    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = torch.full((n,), rank + 1, dtype=dtype, device=dev)
        dist.all_reduce(t)
        check(f"all_reduce sum {dtype}", t, torch.full((n,), 3, dtype=dtype))
    t = torch.arange(17, dtype=torch.float32, device=dev) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce max", t, torch.arange(17, dtype=torch.float32) * 2)
    t = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check("all_reduce avg", t, torch.full((1000,), 1.5))
    t = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    check("all_reduce premul_sum", t, torch.full((1000,), 1.5))

    src = torch.arange(1000, dtype=torch.float32, device=dev) + 1000 * rank
    out = torch.empty(WORLD * 1000, dtype=torch.float32, device=dev)
    dist.all_gather_into_tensor(out, src)
    check("all_gather_into_tensor", out, torch.arange(WORLD * 1000, dtype=torch.float32))

    src = torch.arange(WORLD * 1000, dtype=torch.float32, device=dev) * (rank + 1)
    out = torch.empty(1000, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(out, src)
    check("reduce_scatter_tensor", out, torch.arange(rank * 1000, (rank + 1) * 1000,
                                                      dtype=torch.float32) * 3)

    t = torch.arange(4097, dtype=torch.int32, device=dev) if rank == 1 else \
        torch.zeros(4097, dtype=torch.int32, device=dev)
    dist.broadcast(t, src=1)
    check("broadcast", t, torch.arange(4097, dtype=torch.int32))

    src = torch.arange(WORLD * 8, dtype=torch.float32, device=dev) + 100 * rank
    out = torch.empty(WORLD * 8, dtype=torch.float32, device=dev)
    dist.all_to_all_single(out, src)
    want = torch.cat([torch.arange(rank * 8, rank * 8 + 8, dtype=torch.float32) + 100 * p
                      for p in range(WORLD)])
    check("all_to_all_single", out, want)
    # Uneven splits: rank r sends r+1+p elements to rank p.
    send_splits = [rank + 1 + p for p in range(WORLD)]
    recv_splits = [p + 1 + rank for p in range(WORLD)]
    src = torch.full((sum(send_splits),), float(rank), device=dev)
    out = torch.empty(sum(recv_splits), device=dev)
    dist.all_to_all_single(out, src, recv_splits, send_splits)
    check("all_to_all_single uneven", out,
          torch.cat([torch.full((recv_splits[p],), float(p)) for p in range(WORLD)]))

    peer = 1 - rank
    mine = torch.full((5000,), float(rank + 10), device=dev)
    theirs = torch.empty(5000, device=dev)
    if rank == 0:
        dist.send(mine, dst=peer)
        dist.recv(theirs, src=peer)
    else:
        dist.recv(theirs, src=peer)
        dist.send(mine, dst=peer)
    check("send/recv", theirs, torch.full((5000,), float(peer + 10)))
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer),
                                   dist.P2POp(dist.irecv, theirs, peer)])
    for r in reqs:
        r.wait()
    check("batch_isend_irecv", theirs, torch.full((5000,), float(peer + 10)))

    group = dist.new_group([0, 1])
    t = torch.full((333,), float(rank), device=dev)
    dist.all_reduce(t, group=group)
    check("new_group all_reduce", t, torch.full((333,), 1.0))
    # Rank 0 is not a member: its part of the split is NCCL_SPLIT_NOCOLOR.
    solo = dist.new_group([1])
    if rank == 1:
        t = torch.full((7,), 5.0, device=dev)
        dist.all_reduce(t, group=solo)
        check("one-rank group all_reduce", t, torch.full((7,), 5.0))

    dist.barrier()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    if rank == 0:
        print("TORCH_SMOKE OK", flush=True)


if __name__ == "__main__":
    if torch.cuda.device_count() < WORLD:
        print(f"needs {WORLD} GPUs: skipped")
        sys.exit(77)
    mp.spawn(run, nprocs=WORLD, join=True)
