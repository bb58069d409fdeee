"""DDP training of a small model for 100 steps on 2 ranks; the losses are written as JSON.

  python3 torch_ddp.py --out nccl.json                                    # NVIDIA's NCCL
  LD_PRELOAD=/path/to/coccl/libnccl.so.2 python3 torch_ddp.py --out coccl.json
  python3 torch_ddp.py --compare nccl.json coccl.json                     # exit 0 if they agree

Data and initial weights come from fixed seeds, so the two runs differ only in the library that
averages the gradients; the losses agree within a relative 1e-4 (--rtol: float32 sums may be
ordered differently). run_torch.sh beside this file does all three. Rank r runs on GPU
r % device_count: with one GPU both ranks share it, where NVIDIA's NCCL needs --hostid-per-rank
(and MPS, see run_torch.sh). Exit 77: no GPU. Not part of the product: a test asset.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
STEPS = 100


def loaded_nccl():
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "libnccl" in line})


def train(rank, out, hostid_per_rank):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29518")
    if hostid_per_rank:
        # NVIDIA's NCCL refuses two ranks on one GPU of one host; distinct host ids make it take
        # its network path between them.
        os.environ["NCCL_HOSTID"] = f"host{rank}"
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                          nn.Linear(256, 10)).to(dev)
    # Small buckets: several all_reduces per step, overlapping the backward pass.
    ddp = DDP(model, device_ids=[dev], bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(100 + rank)
    target_w = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(STEPS):
        x = torch.randn(128, 64, generator=gen)
        y = (x @ target_w).argmax(dim=1)
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        # The mean loss over ranks, as every rank sees it.
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        losses.append(avg.item())
    # Every rank must hold the same weights after training.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    other = flat.clone()
    dist.broadcast(other, src=0)
    if not torch.equal(flat, other):
        raise AssertionError(f"rank {rank}: weights differ from rank 0's")
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses, "libnccl": loaded_nccl()}, f)
        print(f"first loss {losses[0]:.6f} last loss {losses[-1]:.6f} -> {out}", flush=True)


def compare(a_path, b_path, rtol):
    a = json.load(open(a_path))["losses"]
    b = json.load(open(b_path))["losses"]
    if len(a) != STEPS or len(b) != STEPS:
        print(f"expected {STEPS} losses, got {len(a)} and {len(b)}")
        return 1
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))
    print(f"max relative loss difference over {STEPS} steps: {worst:.3e} (tolerance {rtol})")
    if not all(math.isfinite(x) for x in a + b) or worst > rtol:
        return 1
    if not b[-1] < b[0]:
        print("the loss did not decrease")
        return 1
    print("DDP_LOSSES_MATCH")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs=2)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--hostid-per-rank", action="store_true",
                        help="NCCL_HOSTID=host<rank> (NVIDIA's NCCL with two ranks on one GPU)")
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare, args.rtol))
    if not args.out:
        parser.error("--out or --compare is required")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print("needs a GPU: skipped")
        sys.exit(77)
    mp.spawn(train, args=(args.out, args.hostid_per_rank), nprocs=WORLD, join=True)
