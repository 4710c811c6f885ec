"""Shared test helpers: the devices to run on, a float64 reference of the op,
relative errors, nn.RNN twins of PersistentRNN modules, a model around one
for TorchScript, the hang guard, and running Python in a subprocess."""

import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import torch_prnn

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def cluster_tier_available():
    """Whether the planner uses thread-block clusters on this GPU: sm_90 or
    newer, and PRNN_DISABLE_CLUSTER_TIER unset, empty or "0" (as the C
    planner reads it)."""
    knob = os.environ.get("PRNN_DISABLE_CLUSTER_TIER", "")
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0) and knob in ("", "0")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Relative error bounds (norm-wise) against a float64 reference; DESIGN.md "Numerics".
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


REPO = Path(__file__).resolve().parents[1]
# NVLink multicast stays off in every process on the GPU machines (NCCL NVLS,
# symmetric memory, NVSHMEM): in the test process and in run_python's.
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _name, _value in NVLS_OFF.items():
    os.environ.setdefault(_name, _value)


def run_python(args, timeout, env_extra=None):
    """Runs `python args...` from the repository root with torch_prnn importable,
    NVLS off and env_extra in the environment; returns (returncode, stdout + stderr). On a timeout the whole
    process group (torchrun and its workers) is killed and the test fails."""
    env = dict(os.environ)  # NVLS_OFF is in it (set above)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"python {' '.join(args)} ran past {timeout} s:\n{out[-4000:]}")
    return proc.returncode, out


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _persistent_path(request, monkeypatch):
    """The modules' calls stay on torch_prnn's kernels, which the tests are
    about, even where torch's own recurrence is faster and a user's call would
    be handed to it (torch_prnn/_crossover.py); tests marked torch_fallback
    see the hand-over as users do."""
    if request.node.get_closest_marker("torch_fallback") is None:
        monkeypatch.setattr(torch_prnn._crossover, "enabled", False)


# ---- hang guard -------------------------------------------------------------
# @pytest.mark.hang_guard(seconds): if the test (setup, call and teardown) is
# still running after `seconds`, faulthandler's watchdog thread (plain C, so it
# fires even while a hung CUDA call holds the GIL) writes every Python thread's
# traceback to the terminal's stderr and ends the process with exit status 1.
# A hang then costs `seconds`, not the whole test run, and says where it
# was. pytest-timeout does the same but is not a dependency.
# PRNN_HANG_GUARD_SCALE multiplies every limit (e.g. 10 under
# compute-sanitizer); 0 turns the guard off.

_real_stderr_fd = None  # a copy of the terminal's stderr, which outlives output capture


def pytest_configure(config):
    global _real_stderr_fd
    config.addinivalue_line(
        "markers",
        "torch_fallback: the modules hand calls to torch's recurrence where it is faster, as for users",
    )
    config.addinivalue_line(
        "markers",
        "hang_guard(seconds): dump every thread's traceback and exit the test process "
        "if the test runs longer than `seconds`",
    )
    # With capture on, fd 2 points into pytest's capture file, whose contents are
    # lost when the watchdog ends the process: dump to the original stderr, which
    # the capture keeps open as err.targetfd_save (a private attribute, hence the
    # fallbacks: without fd capture, fd 2 is the terminal already).
    capman = config.pluginmanager.getplugin("capturemanager")
    err = getattr(getattr(capman, "_global_capturing", None), "err", None)
    fd = getattr(err, "targetfd_save", None)
    if not isinstance(fd, int):
        fd = sys.__stderr__.fileno()
    _real_stderr_fd = os.dup(fd)


@pytest.fixture(autouse=True)
def _hang_guard(request):
    marker = request.node.get_closest_marker("hang_guard")
    seconds = marker.args[0] * float(os.environ.get("PRNN_HANG_GUARD_SCALE", "1")) if marker else 0
    if seconds <= 0:
        yield
        return
    faulthandler.dump_traceback_later(seconds, exit=True, file=_real_stderr_fd)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def run_threads(target, args_list, timeout):
    """target(*args) in one thread per entry of args_list, all at once; fails
    if a thread is still running after `timeout` s or any raised (with the
    arguments and errors)."""
    errors = []

    def guarded(*args):
        try:
            target(*args)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append((args, error))

    threads = [threading.Thread(target=guarded, args=args, daemon=True) for args in args_list]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout  # one limit for all threads together
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


def poison_allocator(device, dtype, *shapes):
    """Leave NaN-filled blocks of the outputs' sizes in the CUDA caching
    allocator, so an output element a kernel fails to write shows up as NaN
    (a no-op on the CPU, whose allocator does not cache)."""
    if torch.device(device).type == "cuda":
        blocks = [torch.full(s, float("nan"), dtype=dtype, device=device) for s in shapes]
        del blocks


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"  # no broadcasting
    out, ref = out.double(), ref.double().to(out.device)  # the reference may live on the CPU
    assert torch.isfinite(out).all(), "non-finite values"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def assert_close(out, ref, dtype, what=""):
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"{what}: relative error {err:.3g} >= {TOL[dtype]:g}"


class _ActivationWithGivenOutput(torch.autograd.Function):
    """act(pre) in the forward; in the backward, act' taken from a given y
    (1 - y^2, or relu's: 0 where y <= 0, else 1, NaN included, as torch's)
    instead of from the exact output."""

    @staticmethod
    def forward(ctx, pre, y, nonlinearity):
        ctx.save_for_backward(y)
        ctx.relu = nonlinearity == "relu"
        return torch.relu(pre) if ctx.relu else torch.tanh(pre)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * ((~(y <= 0)).to(grad.dtype) if ctx.relu else 1 - y * y), None, None


def reference_forward(xp, h0, w_hh, lengths=None, nonlinearity="tanh", act_grad_from=None, dtype=torch.float64):
    """The op's definition as a float64 loop: h_t = act(xp_t + W_hh h_{t-1});
    past a sequence's length its state is frozen and its outputs are zero.

    With `act_grad_from` (the op's own y [T, B, H], any dtype), autograd takes
    the activation's derivative from it, as the backward kernels do from the
    stored y: the reference for float16 / bfloat16 gradients, where 1 - y^2 of
    a rounded y near +-1 (or relu's y > 0 next to 0) differs from the exact one
    by far more than the rounding of y itself, so element-wise errors of a few
    percent are the op's definition, not a bug. dtype: the loop's own (torch's
    implementation in another dtype, whose error against float64 bounds ours)."""
    act = torch.tanh if nonlinearity == "tanh" else torch.relu
    xp, h, w = xp.to(dtype), h0.to(dtype), w_hh.to(dtype)
    given = None if act_grad_from is None else act_grad_from.detach().to(dtype)
    ys = []
    for t in range(xp.shape[0]):
        pre = xp[t] + h @ w.t()
        new = act(pre) if given is None else _ActivationWithGivenOutput.apply(pre, given[t], nonlinearity)
        if lengths is not None:
            alive = (t < lengths).to(xp.device).unsqueeze(1)
            new = torch.where(alive, new, h)
            ys.append(torch.where(alive, new, torch.zeros_like(new)))
        else:
            ys.append(new)
        h = new
    return torch.stack(ys)


def reference_final_state(y, h0, lengths=None):
    """h_n of prnn::forward / prnn::layer from their y: each sequence's state
    after its last step (h0 where it has none)."""
    if lengths is None:
        return y[-1] if y.shape[0] > 0 else h0
    return torch.stack([y[n - 1, b] if n > 0 else h0[b] for b, n in enumerate(lengths.tolist())])


def layer_reference(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity):
    """prnn::layer's definition: the input projection, then reference_forward."""
    xp = x @ w_ih.t() + (b_ih + b_hh if b_ih is not None else 0)
    return reference_forward(xp, h0, w_hh, lengths, nonlinearity)


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


class Batched(torch.nn.Module):
    """A model around a PersistentRNN for tensor input, as TorchScript
    scripts it (the RNN's own forward is overloaded, as nn.RNN's is)."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor, hx: torch.Tensor | None = None):
        return self.rnn(x, hx)
