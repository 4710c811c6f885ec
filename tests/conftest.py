"""Shared test helpers: the devices to run on, a float64 reference of the op,
relative errors, and nn.RNN twins of PersistentRNN modules."""

import pytest
import torch

import torch_prnn

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# Relative error bounds (norm-wise) against a float64 reference; DESIGN.md "Numerics".
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite values"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def assert_close(out, ref, dtype, what=""):
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"{what}: relative error {err:.3g} >= {TOL[dtype]:g}"


def reference_forward(xp, h0, w_hh, lengths=None, nonlinearity="tanh"):
    """The op's definition as a float64 loop: h_t = act(xp_t + W_hh h_{t-1});
    past a sequence's length its state is frozen and its outputs are zero."""
    act = torch.tanh if nonlinearity == "tanh" else torch.relu
    xp, h, w = xp.double(), h0.double(), w_hh.double()
    ys = []
    for t in range(xp.shape[0]):
        new = act(xp[t] + h @ w.t())
        if lengths is not None:
            alive = (t < lengths).to(xp.device).unsqueeze(1)
            new = torch.where(alive, new, h)
            ys.append(torch.where(alive, new, torch.zeros_like(new)))
        else:
            ys.append(new)
        h = new
    return torch.stack(ys)


def make_op_inputs(T, B, H, dtype=torch.float64, device="cpu", requires_grad=False):
    """xp, h0, w_hh with a spectral radius below 1, so relu stays bounded."""
    xp = torch.randn(T, B, H, dtype=dtype, device=device)
    h0 = 0.5 * torch.randn(B, H, dtype=dtype, device=device)
    w = (torch.rand(H, H, dtype=dtype, device=device) * 2 - 1) * H**-0.5
    return [t.requires_grad_(requires_grad) for t in (xp, h0, w)]


def twins(device="cpu", dtype=torch.float64, **kwargs):
    """A PersistentRNN of `dtype`, and an nn.RNN with the same configuration
    and weights in float64: the reference. (nn.RNN in float32 is not one on
    CUDA: cuDNN uses TF32 there by default.)"""
    kwargs = {"input_size": 4, "hidden_size": 7, **kwargs}
    ours = torch_prnn.PersistentRNN(**kwargs, device=device, dtype=dtype)
    reference = torch.nn.RNN(**kwargs, device=device, dtype=torch.float64)
    reference.load_state_dict(ours.state_dict())
    return ours, reference
