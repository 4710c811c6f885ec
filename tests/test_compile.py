"""A small model holding a PersistentRNN under torch.compile (fullgraph,
dynamic shapes), torch.export, and CUDA graphs: same outputs and gradients
as eager."""

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import torch_prnn
from conftest import assert_close, devices


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch_prnn.PersistentRNN(
            4, 8, num_layers=2, batch_first=True, bidirectional=True, dropout=0.3
        )
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        y, h_n = self.rnn(x)
        return self.head(y), h_n


def outputs_and_grads(model, x):
    logits, h_n = model(x)
    loss = logits.square().mean() + h_n.sin().sum()
    return [logits, h_n] + list(torch.autograd.grad(loss, [x] + list(model.parameters())))


def check_same(model, compiled, x):
    x = x.detach().requires_grad_()
    names = ["logits", "h_n", "grad x"] + [f"grad {n}" for n, _ in model.named_parameters()]
    pairs = zip(names, outputs_and_grads(compiled, x), outputs_and_grads(model, x), strict=True)
    for name, got, expected in pairs:
        assert_close(got, expected, torch.float32, name)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", devices)
def test_compile_fullgraph(device):
    model = Tagger().to(device).eval()  # eval: dropout off, so eager and compiled agree
    compiled = torch.compile(model, fullgraph=True)
    check_same(model, compiled, torch.randn(3, 5, 4, device=device))


@pytest.mark.parametrize("device", devices)
def test_compile_dynamic(device):
    model = Tagger().to(device).eval()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    check_same(model, compiled, torch.randn(3, 5, 4, device=device))
    compiles = counter.frame_count
    for batch, steps in [(2, 9), (5, 4)]:
        check_same(model, compiled, torch.randn(batch, steps, 4, device=device))
    assert counter.frame_count == compiles  # symbolic batch and steps: no recompiles


def test_compile_train_mode_dropout():
    """In training mode the compiled graph draws the same dropout masks as
    eager from the same seed (aot_eager keeps torch's RNG), and they matter."""
    model = Tagger().train()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 5, 4)
    torch.manual_seed(7)
    got = compiled(x)[0]
    torch.manual_seed(7)
    expected = model(x)[0]
    assert torch.equal(got, expected)
    assert not torch.equal(got, model.eval()(x)[0])


@pytest.mark.parametrize("device", devices)
def test_export(device):
    model = Tagger().to(device).eval()
    batch, steps = torch.export.Dim("batch"), torch.export.Dim("steps")
    program = torch.export.export(
        model,
        (torch.randn(3, 5, 4, device=device),),
        dynamic_shapes={"x": {0: batch, 1: steps}},
    )
    assert "prnn.layer" in str(program.graph)  # the module's op, kept whole
    for shape in [(3, 5, 4), (2, 7, 4)]:
        x = torch.randn(shape, device=device)
        for name, got, expected in zip(["logits", "h_n"], program.module()(x), model(x), strict=True):
            assert_close(got, expected, torch.float32, f"{name} at {shape}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_training():
    """Forward and backward replayed from CUDA graphs match eager."""
    model = Tagger().cuda().eval()
    x = torch.randn(3, 5, 4, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    check_same(model, graphed, torch.randn(3, 5, 4, device="cuda"))
