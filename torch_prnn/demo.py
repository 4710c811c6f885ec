"""Trains a small character-level language model with PersistentRNN on a few
Shakespeare sonnets, then times one training step of it against the same
model on torch.nn.RNN (same configuration and weights) on this machine.

    python -m torch_prnn.demo [--steps N] [--device cpu|cuda]
"""

import argparse
import copy
import sys
import time
from importlib import resources

import torch
import torch.nn.functional as F
from torch import nn

from torch_prnn import PersistentRNN

HIDDEN, LAYERS, BATCH, SEQ = 128, 2, 16, 64


class CharLM(nn.Module):
    def __init__(self, vocab: int, rnn: nn.Module):
        super().__init__()
        self.embed = nn.Embedding(vocab, HIDDEN)
        self.rnn = rnn
        self.head = nn.Linear(HIDDEN, vocab)

    def forward(self, chars, h=None):
        y, h = self.rnn(self.embed(chars), h)
        return self.head(y), h


def batches(data: torch.Tensor, generator: torch.Generator):
    """Endless random windows: (input [BATCH, SEQ], next characters [BATCH, SEQ])."""
    while True:
        start = torch.randint(len(data) - SEQ - 1, (BATCH, 1), generator=generator)
        window = data[start + torch.arange(SEQ + 1)]
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


def ms_per_step(model, data, device, steps: int) -> float:
    """Median training-step time of a copy of `model` (own optimizer), after warm-up."""
    model = copy.deepcopy(model)
    model.rnn.flatten_parameters()  # nn.RNN's weights into cuDNN's layout again after the copy
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    stream = batches(data, torch.Generator().manual_seed(1))
    times = []
    for step in range(3 + steps):
        chars, targets = (t.to(device) for t in next(stream))
        start = time.perf_counter()
        train_step(model, optimizer, chars, targets)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= 3:
            times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


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
    steps = args.steps or (1000 if device.type == "cuda" else 250)

    text = resources.files("torch_prnn").joinpath("sonnets.txt").read_text(encoding="utf-8")
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    data = torch.tensor([stoi[c] for c in text])

    torch.manual_seed(0)
    rnn = PersistentRNN(HIDDEN, HIDDEN, num_layers=LAYERS, batch_first=True)
    model = CharLM(len(itos), rnn).to(device)
    print(
        f"torch_prnn demo: character LM on {len(text)} characters of Shakespeare, "
        f"PersistentRNN({HIDDEN}, {HIDDEN}, num_layers={LAYERS}), batch {BATCH} x {SEQ} "
        f"characters, {steps} steps on {device}"
    )

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    stream = batches(data, torch.Generator().manual_seed(0))
    first = None
    recent = []
    for step in range(1, steps + 1):
        loss = train_step(model, optimizer, *(t.to(device) for t in next(stream))).item()
        first = loss if first is None else first
        recent = (recent + [loss])[-20:]
        if step == steps or step % max(1, steps // 100) == 0:
            progress(step, steps, sum(recent) / len(recent))
    mean = sum(recent) / len(recent)
    print(f"\nloss {first:.3f} -> {mean:.3f} (mean of the last {len(recent)} steps)")
    print("sample: " + sample(model, "Shall I ", 120, stoi, itos, device).replace("\n", " / "))

    # The same model on nn.RNN: same configuration, same weights.
    reference = copy.deepcopy(model)
    reference.rnn = nn.RNN(HIDDEN, HIDDEN, num_layers=LAYERS, batch_first=True).to(device)
    reference.rnn.load_state_dict(model.rnn.state_dict())
    timing_steps = 50 if device.type == "cuda" else 10
    ours = ms_per_step(model, data, device, timing_steps)
    theirs = ms_per_step(reference, data, device, timing_steps)
    print(
        f"training step: PersistentRNN {ours:.2f} ms, nn.RNN {theirs:.2f} ms "
        f"-> {theirs / ours:.2f}x the speed of nn.RNN on {device}"
        + (" (on the CPU torch_prnn runs its C reference loop; the fast path is CUDA)"
           if device.type == "cpu" else "")
    )


if __name__ == "__main__":
    main()
