"""FSDP2 (fully_shard) training of a small transformer on 2 ranks; the losses are written as JSON.

What it tests: FSDP2 drives one communicator from several CUDA streams at once (all-gathers of
the next layer's parameters on one stream, reduce-scatters of the previous layer's gradients on
another, ordered by CUDA events), which DDP never does. A 4-layer nn.TransformerEncoder (d_model
256, 4 heads, dropout 0) with a linear head is trained for 30 AdamW steps; every encoder layer is
fully_shard'ed and so is the root (which holds the head). Data and initial weights come from
fixed seeds and the math is made deterministic (no TF32, math attention, deterministic
algorithms), so two runs differ only in the library that gathers parameters and reduces
gradients. After training every rank gathers the full parameters (DTensor.full_tensor()) and
checks that they are bitwise the same as rank 0's.

  python3 torch_fsdp.py --out nccl.json                                    # NVIDIA's NCCL
  LD_PRELOAD=/path/to/coccl/libnccl.so.2 python3 torch_fsdp.py --out coccl.json
  python3 torch_fsdp.py --compare nccl.json coccl.json                     # exit 0 if they agree

run_torch.sh beside this file does all three (and handles one GPU). Rank r runs on GPU
r % device_count: with one GPU both ranks share it, where NVIDIA's NCCL needs --hostid-per-rank
(and MPS, see run_torch.sh). Exit 77: no GPU.

Tolerance: the per-step loss (mean over ranks) and the norm of the final parameters agree within
a relative 1e-4 (--rtol). Float32 sums are not associative, so a library may legitimately sum the
ranks' gradients in another order or scale for the average before or after summing; each such
difference is about one ulp (1.2e-7 relative) in some gradient elements, and 30 steps of AdamW
grow it to well under 1e-5 in the loss. A wrong chunk, a lost or raced stream dependency, or a
stale buffer moves the loss by 1e-3 or more (or makes it NaN). The parameter norm also covers the
last optimizer step, which no loss sees. Not part of the product: a test asset.
"""
import datetime
import json
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch_ranks import WORLD, join, loaded_nccl, main

STEPS = 30
D_MODEL = 256
NHEAD = 4
LAYERS = 4
CLASSES = 16
BATCH = 8
SEQ = 32


def import_fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # PyTorch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # PyTorch 2.4, 2.5
    return fully_shard


def setup(rank, args):
    # cuBLAS is deterministic only with a fixed workspace (read when its handle is made).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return join(rank, args, 29519, timeout=datetime.timedelta(seconds=180))


def make_deterministic():
    # Only the legacy TF32 switch (as torch_ddp.py): PyTorch >= 2.9 raises when the legacy and the
    # new (fp32_precision) APIs are mixed, and internal readers still use the legacy one.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    # The math attention is plain matmuls and softmax; the fused kernels may use atomics.
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(torch.backends.cuda, name):
            getattr(torch.backends.cuda, name)(False)
    torch.use_deterministic_algorithms(True, warn_only=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(D_MODEL, NHEAD, dim_feedforward=4 * D_MODEL,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, x):
        return self.head(self.encoder(x))


def build_model(dev, fully_shard):
    from torch.distributed.device_mesh import init_device_mesh
    # The same seed on every rank: FSDP2 does not broadcast the initial weights.
    torch.manual_seed(1234)
    model = Net()
    # TransformerEncoder deep-copies one layer; distinct weights per layer, as nn.Transformer does.
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    model.to(dev)
    # One dimension over the whole world: the mesh's group is the default process group.
    mesh = init_device_mesh("cuda", (WORLD,))
    for layer in model.encoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(rank, args):
    dev = setup(rank, args)
    make_deterministic()
    model = build_model(dev, import_fully_shard())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    target_w = torch.randn(D_MODEL, CLASSES, generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, SEQ, D_MODEL, generator=gen)
        y = (x @ target_w).argmax(dim=-1)
        x, y = x.to(dev), y.to(dev)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        # The mean loss over ranks, read at the end: no host sync between steps.
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        losses.append(avg)
    losses = torch.stack(losses).tolist()

    with torch.no_grad():
        full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
        flat = torch.cat([t.detach().flatten() for t in full])
        other = flat.clone()
        dist.broadcast(other, src=0)
        if not torch.equal(flat, other):
            bad = int((flat != other).sum())
            raise AssertionError(f"rank {rank}: {bad} of {flat.numel()} full parameters differ "
                                 "from rank 0's")
        param_norm = flat.double().norm().item()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    if rank == 0:
        result = {"losses": losses, "param_norm": param_norm, "params": flat.numel(),
                  "libnccl": loaded_nccl(), "torch": torch.__version__,
                  "gpus": torch.cuda.device_count()}
        with open(args.out, "w") as f:
            json.dump(result, f)
        print(f"first loss {losses[0]:.6f} last loss {losses[-1]:.6f} parameter norm "
              f"{param_norm:.6f} ({flat.numel()} parameters, same on every rank) -> {args.out}",
              flush=True)


def compare(a_path, b_path, rtol):
    a = json.load(open(a_path))
    b = json.load(open(b_path))
    la, lb = a["losses"], b["losses"]
    if len(la) != STEPS or len(lb) != STEPS:
        print(f"expected {STEPS} losses, got {len(la)} and {len(lb)}")
        return 1
    values = la + lb + [a["param_norm"], b["param_norm"]]
    if not all(math.isfinite(v) for v in values):
        print("a loss or parameter norm is not finite")
        return 1
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(la, lb))
    norm_diff = abs(a["param_norm"] - b["param_norm"]) / max(abs(a["param_norm"]), 1e-12)
    print(f"max relative loss difference over {STEPS} steps: {worst:.3e}; relative parameter "
          f"norm difference: {norm_diff:.3e} (tolerance {rtol})")
    if worst > rtol or norm_diff > rtol:
        for step, (x, y) in enumerate(zip(la, lb)):
            print(f"  step {step:2d}: {x:.8f} {y:.8f}")
        return 1
    for name, losses in ((a_path, la), (b_path, lb)):
        if not sum(losses[-5:]) < sum(losses[:5]):
            print(f"{name}: the loss did not decrease")
            return 1
    print("FSDP2_LOSSES_MATCH")
    return 0


if __name__ == "__main__":
    main(__doc__, train, lambda a, b, args: compare(a, b, args.rtol),
         lambda parser: parser.add_argument("--rtol", type=float, default=1e-4))
