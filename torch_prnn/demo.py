"""Trains a small character-level language model with PersistentRNN on a few
Shakespeare sonnets, then times training steps of it against the same model on
torch.nn.RNN (same configuration, same initial weights) on this machine.

    python -m torch_prnn.demo [--steps N] [--device cpu|cuda]

On CUDA the model is sized where a persistent kernel pays (long sequences,
small batch: 256 characters x 4, hidden 512, two layers); on the CPU, where
each step is a BLAS GEMM through ATen as nn.RNN's, it stays small and quick.
"""

import argparse
import copy
import sys
import time
from dataclasses import dataclass
from importlib import resources

import torch
import torch.nn.functional as F
from torch import nn

from torch_prnn import PersistentRNN


@dataclass(frozen=True)
class Config:
    hidden: int  # embedding width = hidden size
    layers: int
    batch: int
    seq: int  # characters per sequence
    steps: int  # training steps
    lr: float
    timing_steps: int  # timed steps per model, after WARMUP


CONFIGS = {
    "cpu": Config(hidden=128, layers=2, batch=16, seq=64, steps=250, lr=3e-3, timing_steps=10),
    "cuda": Config(hidden=512, layers=2, batch=4, seq=256, steps=1000, lr=2e-3, timing_steps=50),
}
WARMUP = 5


class CharLM(nn.Module):
    def __init__(self, vocab: int, hidden: int, rnn: nn.Module):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = rnn
        self.head = nn.Linear(hidden, vocab)

    def forward(self, chars, h=None):
        y, h = self.rnn(self.embed(chars), h)
        return self.head(y), h


def batches(data: torch.Tensor, cfg: Config, generator: torch.Generator):
    """Endless random windows: (input [batch, seq], next characters [batch, seq])."""
    while True:
        start = torch.randint(len(data) - cfg.seq - 1, (cfg.batch, 1), generator=generator)
        window = data[start + torch.arange(cfg.seq + 1)]
        yield window[:, :-1], window[:, 1:]


def train_step(model, optimizer, chars, targets) -> torch.Tensor:
    logits, _ = model(chars)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.detach()


def progress(step: int, steps: int, loss: float, width: int = 30) -> None:
    done = width * step // steps
    bar = "#" * done + "." * (width - done)
    sys.stdout.write(f"\r[{bar}] step {step:4d}/{steps}  loss {loss:.3f}")
    sys.stdout.flush()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_training(models: dict, data, cfg: Config, device) -> dict:
    """Trains each model (own Adam) on the same batches, one step of each in
    turn so that clocks and other load hit both alike. Each step is timed from
    an idle device to an idle device (synchronize before and after: its whole
    cost, kernels and Python alike), after WARMUP untimed steps. Returns per
    model (median ms per step, mean loss of the first and of the last 5 steps)."""
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=cfg.lr) for name, m in models.items()}
    stream = batches(data, cfg, torch.Generator().manual_seed(1))
    times = {name: [] for name in models}
    losses = {name: [] for name in models}
    for step in range(WARMUP + cfg.timing_steps):
        chars, targets = (t.to(device) for t in next(stream))
        for name, model in models.items():
            sync(device)
            start = time.perf_counter()
            loss = train_step(model, optimizers[name], chars, targets)
            sync(device)
            elapsed = time.perf_counter() - start
            losses[name].append(loss.item())
            if step >= WARMUP:
                times[name].append(elapsed)
    result = {}
    for name in models:
        ts, ls = sorted(times[name]), losses[name]
        result[name] = (1e3 * ts[len(ts) // 2], sum(ls[:5]) / 5, sum(ls[-5:]) / 5)
    return result


@torch.no_grad()
def sample(model, prompt: str, length: int, stoi: dict, itos: list, device) -> str:
    """Continues `prompt` one character at a time, carrying the state."""
    chars = torch.tensor([[stoi[c] for c in prompt]], device=device)
    logits, h = model(chars)
    out = []
    generator = torch.Generator(device=device).manual_seed(0)
    for _ in range(length):
        probs = F.softmax(logits[0, -1] / 0.8, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator)
        out.append(itos[nxt.item()])
        logits, h = model(nxt.view(1, 1), h)
    return prompt + "".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="training steps (default: cpu 250, cuda 1000)")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="default: cuda if available, else cpu",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    cfg = CONFIGS["cuda" if device.type == "cuda" else "cpu"]
    steps = args.steps or cfg.steps

    text = resources.files("torch_prnn").joinpath("sonnets.txt").read_text(encoding="utf-8")
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    data = torch.tensor([stoi[c] for c in text])

    torch.manual_seed(0)
    rnn = PersistentRNN(cfg.hidden, cfg.hidden, num_layers=cfg.layers, batch_first=True)
    model = CharLM(len(itos), cfg.hidden, rnn).to(device)
    initial = copy.deepcopy(model)  # the starting point of the timed runs
    where = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(
        f"torch_prnn demo: character LM on {len(text)} characters of Shakespeare, "
        f"PersistentRNN({cfg.hidden}, {cfg.hidden}, num_layers={cfg.layers}), batch {cfg.batch} x "
        f"{cfg.seq} characters, {steps} steps on {device}{where}"
    )

    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    stream = batches(data, cfg, torch.Generator().manual_seed(0))
    first = None
    recent = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        loss = train_step(model, optimizer, *(t.to(device) for t in next(stream))).item()
        first = loss if first is None else first
        recent = (recent + [loss])[-20:]
        if step == steps or step % max(1, steps // 100) == 0:
            progress(step, steps, sum(recent) / len(recent))
    mean = sum(recent) / len(recent)
    print(
        f"\nloss {first:.3f} -> {mean:.3f} (mean of the last {len(recent)} steps) "
        f"in {time.perf_counter() - start:.1f} s"
    )
    print("sample: " + sample(model, "Shall I ", 120, stoi, itos, device).replace("\n", " / "))

    # Training-step time from the same initial weights: the model as trained
    # above, and the same model on nn.RNN (PyTorch's defaults: cuDNN on CUDA).
    ours = copy.deepcopy(initial)
    theirs = copy.deepcopy(initial)
    theirs.rnn = nn.RNN(cfg.hidden, cfg.hidden, num_layers=cfg.layers, batch_first=True).to(device)
    theirs.rnn.load_state_dict(initial.rnn.state_dict())
    theirs.rnn.flatten_parameters()  # cuDNN's single weight buffer (a no-op if already so)
    print(
        f"timing {cfg.timing_steps} training steps of each (after {WARMUP} warm-up steps), "
        "both from the same initial weights:"
    )
    result = time_training({"PersistentRNN": ours, "nn.RNN": theirs}, data, cfg, device)
    for name, (ms, loss_start, loss_end) in result.items():
        print(f"  {name:<13} {ms:8.2f} ms per step, loss {loss_start:.3f} -> {loss_end:.3f}")
    ours_ms, theirs_ms = result["PersistentRNN"][0], result["nn.RNN"][0]
    print(
        f"training step: PersistentRNN {ours_ms:.2f} ms, nn.RNN {theirs_ms:.2f} ms "
        f"-> {theirs_ms / ours_ms:.2f}x the speed of nn.RNN on {device}"
        + (" (on the CPU each step is a BLAS GEMM, as nn.RNN's; the persistent kernels are CUDA's)"
           if device.type == "cpu" else where)
    )


if __name__ == "__main__":
    main()
