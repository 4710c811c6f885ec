"""Data-parallel training of a PersistentRNN (or PersistentLSTM / PersistentGRU)
under DistributedDataParallel, checked against single-process training on the
whole batch.

    torchrun --nproc_per_node 2 examples/ddp_train.py          # NCCL, one GPU per rank
    torchrun --nproc_per_node 2 examples/ddp_train.py --cpu    # gloo on the CPU
                                                               # (also without CUDA)
    torchrun --nproc_per_node 2 examples/ddp_train.py --cell lstm   # or gru

Every step each rank trains on its own shard of the batch and DDP averages the
gradients. Rank 0 also trains a plain copy of the model (same initial weights,
same optimizer) on the whole batch - every rank's shard, regenerated from the
seed - and after every step compares the DDP model's gradients and parameters
with the copy's. The last line says "... OK" and the exit status is 0 when they
match; on a mismatch it says "MISMATCH" and every rank exits 1.
"""
import os

# NVLink multicast stays off where this runs (NCCL NVLS, symmetric memory,
# NVSHMEM); set before anything reads them.
for _name, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import copy  # noqa: E402
import datetime  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

try:
    import torch_prnn
except ImportError:  # run from a checkout without installing: the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch_prnn

INPUT, HIDDEN, SEQ, SHARD = 8, 32, 24, 4  # features, hidden units, steps, sequences per rank
# fp32 with TF32 off: the DDP and single-process runs differ only in summation
# order (shard vs whole batch, all-reduce), a few ulps that SGD carries along.
RTOL, ATOL = 1e-4, 1e-6


CELLS = {"rnn": torch_prnn.PersistentRNN, "lstm": torch_prnn.PersistentLSTM, "gru": torch_prnn.PersistentGRU}


class Model(nn.Module):
    """A 2-layer bidirectional recurrent module of `cell` and a linear read-out of its last output."""

    def __init__(self, cell):
        super().__init__()
        self.rnn = CELLS[cell](INPUT, HIDDEN, num_layers=2, bidirectional=True)
        self.head = nn.Linear(2 * HIDDEN, 1)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[-1]).squeeze(-1)


def shard(seed, step, rank, device):
    """Rank `rank`'s inputs [SEQ, SHARD, INPUT] and targets [SHARD] at `step`,
    a function of (seed, step, rank) alone, so rank 0 can rebuild every rank's.
    The task: twice the mean of the first feature over the last four steps."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(SEQ, SHARD, INPUT, generator=gen)
    return x.to(device), 2 * x[-4:, :, 0].mean(0).to(device)


def max_diff(a_params, b_params, attr):
    """Largest |a - b| over the parameters' `attr` ("data" or "grad"), and
    whether every pair is allclose."""
    worst, close = 0.0, True
    for a, b in zip(a_params, b_params, strict=True):
        a, b = getattr(a, attr), getattr(b, attr)
        worst = max(worst, (a - b).abs().max().item())
        close &= torch.allclose(a, b, rtol=RTOL, atol=ATOL)
    return worst, close


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU even with CUDA")
    parser.add_argument("--cell", choices=sorted(CELLS), default="rnn")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    # Launched without torchrun: a world of one.
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531")):
        os.environ.setdefault(name, value)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])

    use_cuda = torch.cuda.is_available() and not args.cpu
    timeout = datetime.timedelta(seconds=120)  # a lost rank fails the run instead of hanging it
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            sys.exit(f"rank {rank}: local rank {local_rank} but only "
                     f"{torch.cuda.device_count()} GPU(s); NCCL needs one GPU per rank")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # Compare in true fp32: TF32 matmuls would differ by ~1e-3 between the two runs.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)

    torch.manual_seed(args.seed)
    model = Model(args.cell).to(device)
    # Rank 0's weights are what DDP broadcasts at construction: the copy starts equal.
    reference = copy.deepcopy(model) if rank == 0 else None
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    if reference is not None:
        ref_optimizer = torch.optim.SGD(reference.parameters(), lr=args.lr, momentum=0.9)

    losses, max_grad_diff, max_param_diff, close = [], 0.0, 0.0, True  # rank 0's record
    for step in range(args.steps):
        x, target = shard(args.seed, step, rank, device)
        optimizer.zero_grad()
        F.mse_loss(ddp(x), target).backward()  # DDP all-reduces (averages) the gradients here
        optimizer.step()

        if reference is not None:
            # The whole batch: the mean loss over world * SHARD sequences has
            # the gradient that DDP's average of the per-shard mean losses has.
            shards = [shard(args.seed, step, r, device) for r in range(world)]
            xs = torch.cat([s[0] for s in shards], dim=1)
            targets = torch.cat([s[1] for s in shards])
            ref_optimizer.zero_grad()
            loss = F.mse_loss(reference(xs), targets)
            loss.backward()
            ref_optimizer.step()
            losses.append(loss.item())
            grad_diff, grads_close = max_diff(model.parameters(), reference.parameters(), "grad")
            param_diff, params_close = max_diff(model.parameters(), reference.parameters(), "data")
            max_grad_diff, max_param_diff = max(max_grad_diff, grad_diff), max(max_param_diff, param_diff)
            if close and not (grads_close and params_close):
                print(f"ddp: step {step}: grad diff {grad_diff:.3g}, param diff {param_diff:.3g} "
                      f"beyond rtol={RTOL:g} atol={ATOL:g}", flush=True)
            close &= grads_close and params_close

    # DDP keeps replicas equal: every rank checks its parameters against rank 0's.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    replica = flat.clone()
    dist.broadcast(replica, src=0)
    replica_diff = torch.tensor([(flat - replica).abs().max().item()], device=device)
    dist.all_reduce(replica_diff, op=dist.ReduceOp.MAX)
    verdict = torch.tensor([float(close)], device=device)
    dist.broadcast(verdict, src=0)  # every rank exits with rank 0's verdict
    ok = verdict.item() == 1 and replica_diff.item() == 0

    if rank == 0:
        backend = "nccl" if use_cuda else "gloo"
        k = min(5, len(losses))  # each step draws a new batch: average a few
        print(f"ddp: {args.cell} {backend} on {device.type}, whole-batch loss {sum(losses[:k]) / k:.4f} "
              f"(first {k} steps) -> {sum(losses[-k:]) / k:.4f} (last {k})")
        print(f"ddp: {world} ranks, {args.steps} steps, max grad diff {max_grad_diff:.3g}, "
              f"max param diff {max_param_diff:.3g}, replica diff {replica_diff.item():.3g} "
              f"{'OK' if ok else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()
    # The backend's worker thread may still be dropping its last collective's
    # tensors, which takes the GIL; if the interpreter is already shutting down
    # that aborts the process (torch 2.13 gloo, ~1 run in 10, with nn.RNN too).
    # Releasing the GIL for a moment lets it finish first.
    time.sleep(0.2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
