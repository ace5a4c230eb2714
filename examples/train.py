#!/usr/bin/env python3
"""A real PyTorch training job that follows gpuloom's job protocol.

Install the optional extra first: ``pip install '.[torch]'`` (a CPU build is enough).

What it does
* trains a small CNN on synthetic images.  Sample ``i`` is generated from seed ``i``
  and preprocessed on the CPU (``--work`` rounds of blur + non-linearity + flips),
  inside DataLoader worker processes: ``--workers`` defaults to the number of CPU
  cores the job may run on (``os.sched_getaffinity``), each worker single-threaded.
  With enough ``--work`` the loader is the bottleneck, so the cores gpuloom gives
  the job really change its speed;
* uses the GPUs in ``CUDA_VISIBLE_DEVICES`` when CUDA is available (several: DataParallel);
* **distributed** when started with ``WORLD_SIZE`` > 1 (by gpuloom across nodes, one process per node,
  or by ``torchrun``): ``torch.distributed`` (NCCL on GPUs, gloo on the CPU) with
  DistributedDataParallel, one device per process (``LOCAL_RANK``).  Rank ``r`` of ``W`` takes
  the ``r``-th ``1/W`` of every batch (``--batch-size`` must divide by ``W``), so the averaged
  gradient is the whole batch's and the weights follow the one-process run.  Rank 0 prints
  progress, writes the ledger and the checkpoint; every rank stops at the same step (the SIGTERM
  flag is all-reduced each step);
* prints ``GPULOOM_PROGRESS iter=<steps done> samples=<...> t=<unix time> loss=<...>``
  after every step;
* on SIGTERM finishes the current step, saves model, optimizer and step to
  ``$GPULOOM_CHECKPOINT_DIR/train.pt`` (write + rename, so a checkpoint is never
  half-written) and exits 143.  Exit 0 means all ``--steps`` are done;
* with ``GPULOOM_RESUME=1`` restores that checkpoint and continues.  Batch ``s`` always
  holds samples ``s*B .. s*B+B-1``, so every step runs exactly once, on the same data,
  and an interrupted run ends with the same weights as an uninterrupted one.
  ``--ledger FILE`` appends each step number run (tests check exactly-once with it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

STOP = False
NUM_CLASSES = 4


def on_term(signum: int, frame: object) -> None:
    global STOP
    STOP = True


class SyntheticImages(Dataset):
    """Deterministic synthetic images with CPU-heavy preprocessing."""

    def __init__(self, length: int, size: int, work: int, seed: int) -> None:
        self.length, self.size, self.work, self.seed = length, size, work, seed
        self.kernel = torch.full((3, 1, 3, 3), 1.0 / 9.0)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(3, self.size, self.size, generator=g)
        label = int(x[0].mean() > 0) + 2 * int(x[1].mean() > 0)  # learnable from the raw image
        x = x.unsqueeze(0)
        for r in range(self.work):  # "augmentation": blur, squash, flip
            x = F.conv2d(x, self.kernel, padding=1, groups=3)
            x = torch.tanh(1.5 * x) + 0.1 * torch.sin(3.0 * x)
            if (i + r) % 2:
                x = torch.flip(x, dims=(3,))
        return x.squeeze(0), label


class StepSampler(Sampler[int]):
    """Sample indices from ``start_step * batch`` on: batch ``s`` is always samples ``s*B..s*B+B-1``;
    rank ``r`` of ``world`` takes the ``r``-th slice of each."""

    def __init__(self, start_step: int, steps: int, batch: int, rank: int = 0, world: int = 1) -> None:
        self.start, self.steps, self.batch, self.rank, self.world = start_step, steps, batch, rank, world

    def __iter__(self):
        per = self.batch // self.world
        for s in range(self.start, self.steps):
            lo = s * self.batch + self.rank * per
            yield from range(lo, lo + per)

    def __len__(self) -> int:
        return (self.steps - self.start) * (self.batch // self.world)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, NUM_CLASSES),
    )


def worker_init(_: int) -> None:
    torch.set_num_threads(1)
    # SIGTERM goes to the whole process group; the main process decides when workers stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description="gpuloom example: PyTorch training on synthetic data")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=48)
    ap.add_argument("--work", type=int, default=12, help="preprocessing rounds per sample (CPU cost)")
    ap.add_argument("--workers", type=int, default=-1, help="DataLoader workers (default: the cores given)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: on SIGTERM)")
    ap.add_argument("--ledger", default="")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("GPULOOM_CHECKPOINT_DIR", ""))
    ap.add_argument("--dist-timeout", type=float, default=120.0, help="seconds a collective may wait for a peer")
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.steps < 0 or args.batch_size < 1 or args.work < 0 or args.image_size < 4:
        print("train.py: need --steps >= 0, --batch-size >= 1, --work >= 0, --image-size >= 4", file=sys.stderr)
        return 2
    if args.batch_size % world:
        print(f"train.py: --batch-size {args.batch_size} does not divide by WORLD_SIZE={world}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, on_term)

    cores = len(os.sched_getaffinity(0))
    workers = cores if args.workers < 0 else args.workers
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # the model is small; the cores belong to the data loader
    cuda = torch.cuda.is_available()
    distributed = world > 1
    if distributed:
        import datetime

        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.dist_timeout))
        device = torch.device(f"cuda:{local}" if cuda else "cpu")
    else:
        device = torch.device("cuda" if cuda else "cpu")
    lead = rank == 0
    model = make_model()
    if cuda and not distributed and torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    ckpt = Path(args.checkpoint_dir) / "train.pt" if args.checkpoint_dir else None
    if ckpt is not None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
    step = 0
    if os.environ.get("GPULOOM_RESUME") == "1":
        if ckpt is not None and ckpt.exists():
            state = torch.load(ckpt, map_location=device)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            step = int(state["step"])
            print(f"resumed from {ckpt} at step {step}", flush=True)
        else:
            print("GPULOOM_RESUME=1 but no checkpoint: starting from step 0", flush=True)

    plain = model  # saved without the DistributedDataParallel wrapper: one checkpoint for any world size
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)

    def checkpoint() -> None:
        if ckpt is not None and lead:
            save(ckpt, {"model": plain.state_dict(), "opt": opt.state_dict(), "step": step})

    def stopping() -> bool:
        if not distributed:
            return STOP
        flag = torch.tensor([1 if STOP else 0], device=device)  # NCCL reduces on the GPU, gloo on the CPU
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    print(f"train.py: device={device} gpus={visible!r} cores={cores} workers={workers} "
          f"start_step={step} steps={args.steps} rank={rank} world={world}", flush=True)
    data = SyntheticImages(args.steps * args.batch_size, args.image_size, args.work, args.seed)
    loader = DataLoader(
        data, batch_size=args.batch_size // world,
        sampler=StepSampler(step, args.steps, args.batch_size, rank, world),
        num_workers=workers, worker_init_fn=worker_init if workers else None, pin_memory=cuda,
        persistent_workers=False, prefetch_factor=2 if workers else None,
    )
    ledger = open(args.ledger, "a") if args.ledger and lead else None
    model.train()
    last_loss = float("nan")
    it = iter(loader)
    try:
        while step < args.steps:
            if stopping():
                checkpoint()
                print(f"checkpointed at step {step}", flush=True)
                return 128 + signal.SIGTERM
            x, y = next(it)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            last_loss = loss.item()
            if ledger is not None:
                ledger.write(f"{step}\n")
                ledger.flush()
            if lead:
                print(f"GPULOOM_PROGRESS iter={step} samples={step * args.batch_size} t={time.time():.6f} "
                      f"loss={last_loss:.4f}", flush=True)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint()
    finally:
        del it  # shuts the workers down
    checkpoint()
    if distributed:
        dist.barrier()  # the checkpoint is written before any rank reports success
        dist.destroy_process_group()
    print(f"done steps={step} loss={last_loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
