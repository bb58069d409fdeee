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
import json
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_ranks import join, loaded_nccl, main

STEPS = 100


def train(rank, args):
    out = args.out
    dev = join(rank, args, 29518)
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
    main(__doc__, train, lambda a, b, args: compare(a, b, args.rtol),
         lambda parser: parser.add_argument("--rtol", type=float, default=1e-4))
