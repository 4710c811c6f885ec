"""The hand-over to torch's own recurrence where it is faster
(torch_prnn/_crossover.py): which calls go, that a handed-over call is nn's
computation bit for bit (outputs, states and gradients), for every input form,
and that the modules' parameters are in cuDNN's layout on CUDA so that cuDNN
neither warns nor copies them."""

import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import torch_prnn
from torch_prnn import _crossover

from conftest import REPO, run_python  # noqa: F401

pytestmark = pytest.mark.torch_fallback

CELLS = {"rnn": (torch_prnn.PersistentRNN, nn.RNN), "lstm": (torch_prnn.PersistentLSTM, nn.LSTM),
         "gru": (torch_prnn.PersistentGRU, nn.GRU)}


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("training", [False, True])
def test_cuda_limits_are_a_batch_threshold(cell, dtype, training):
    # For each hidden size, ours up to some batch and torch from there on, never back.
    for hidden in (7, 256, 384, 385, 512, 768, 1024, 1025, 2048, 4096):
        on_torch = [_crossover.torch_runs(cell, dtype, "cuda", b, hidden, training=training)
                    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)]
        assert on_torch == sorted(on_torch), (hidden, on_torch)
    assert not _crossover.torch_runs(cell, dtype, "cuda", 1, 256, training=training)
    assert _crossover.torch_runs(cell, dtype, "cuda", 4096, 2048, training=training)


def test_limits_follow_the_measurements(monkeypatch):
    monkeypatch.setattr(_crossover, "_cudnn_persistent_device", lambda index: True)  # as on an H200
    monkeypatch.setattr(_crossover, "_CPU_HAS_ONEDNN_BFLOAT16", False)  # a CPU without it
    faster = _crossover.torch_runs
    assert not faster("lstm", torch.bfloat16, "cuda", 8, 256)
    assert faster("lstm", torch.float32, "cuda", 16, 1024, training=True)
    assert faster("lstm", torch.float32, "cuda", 16, 1024)  # forward 0.90-0.95x at T = 256
    assert not faster("lstm", torch.float32, "cuda", 8, 1024)
    # One timestep a call without gradients (the few-steps kernel, prnn::layers) stays ours to B = 16.
    assert not faster("lstm", torch.float32, "cuda", 16, 1024, steps=1, layers_op=True)
    assert faster("lstm", torch.float32, "cuda", 16, 1024, steps=1)  # the regular path: a GEMM and prnn::lstm
    assert faster("lstm", torch.float32, "cuda", 16, 1024, steps=2, layers_op=True)
    assert faster("lstm", torch.float32, "cuda", 16, 1024, training=True, steps=1, layers_op=True)
    assert faster("lstm", torch.float32, "cuda", 17, 1024, steps=1, layers_op=True)
    assert faster("gru", torch.float32, "cuda", 4, 2048, steps=1, layers_op=True)
    assert not faster("rnn", torch.float32, "cuda", 4, 2048, steps=1, layers_op=True)
    assert faster("lstm", torch.float16, "cuda", 8, 1024, steps=1, layers_op=True)  # not timed at T = 1: its limits
    # Short float16 Elman forwards at H = 256 past B = 16: nn's fixed cost is below ours.
    assert faster("rnn", torch.float16, "cuda", 32, 256, steps=16)
    assert faster("rnn", torch.float16, "cuda", 128, 256, steps=63)
    assert faster("rnn", torch.float16, "cuda", 17, 200, steps=1, layers_op=True)
    assert not faster("rnn", torch.float16, "cuda", 32, 256, steps=64)
    assert not faster("rnn", torch.float16, "cuda", 128, 256)  # steps unknown: the batch limit
    assert not faster("rnn", torch.float16, "cuda", 16, 256, steps=16)
    assert not faster("rnn", torch.float16, "cuda", 32, 257, steps=16)
    assert not faster("rnn", torch.float16, "cuda", 32, 256, training=True, steps=16)
    assert not faster("rnn", torch.bfloat16, "cuda", 32, 256, steps=16)
    assert not faster("rnn", torch.float32, "cuda", 128, 512)  # the Elman cluster tier
    assert faster("rnn", torch.float32, "cuda", 256, 512)
    assert not faster("rnn", torch.bfloat16, "cuda", 256, 1024)  # 16-bit Elman: waves from B = 512
    assert faster("rnn", torch.bfloat16, "cuda", 512, 1024)
    assert not faster("rnn", torch.bfloat16, "cuda", 1024, 512)
    assert not faster("rnn", torch.bfloat16, "cuda", 1024, 256)
    assert not faster("rnn", torch.float16, "cuda", 128, 256)  # cuDNN's float16 persistent kernel
    assert faster("rnn", torch.float16, "cuda", 256, 256, training=True)
    assert faster("gru", torch.float32, "cuda", 4, 2048)  # past the persistent gated kernels
    # Elman past H = 2048: one launch a step in float32, W_hh in shared memory in 16 bits to 3072
    assert not faster("rnn", torch.float32, "cuda", 16, 2048)
    assert faster("rnn", torch.float32, "cuda", 1, 2560)
    assert not faster("rnn", torch.bfloat16, "cuda", 8, 3072, training=True)
    assert faster("rnn", torch.bfloat16, "cuda", 16, 3072)
    assert faster("rnn", torch.float16, "cuda", 1, 4096)
    assert faster("lstm", torch.float32, "cuda", 1, 256, proj_size=64)
    # The CPU: nn.LSTM's oneDNN LSTM but for the shortest calls; with a projection ATen's steps.
    assert faster("lstm", torch.float32, "cpu", 1, 256)  # steps unknown: a long call
    assert faster("lstm", torch.float32, "cpu", 1, 16, steps=3)
    assert not faster("lstm", torch.float32, "cpu", 1, 8, steps=1)  # one small step a call: ours
    assert not faster("lstm", torch.float32, "cpu", 1, 1024, steps=2)
    assert faster("lstm", torch.float32, "cpu", 4, 1024, steps=1)
    assert faster("lstm", torch.float32, "cpu", 4, 256, steps=1)
    assert not faster("lstm", torch.float32, "cpu", 16, 64, steps=2)
    assert faster("lstm", torch.float32, "cpu", 16, 128, steps=2)
    assert not faster("lstm", torch.float32, "cpu", 16, 1024, training=True, steps=2)
    assert faster("lstm", torch.float32, "cpu", 1, 64, training=True, steps=5)
    assert not faster("lstm", torch.float32, "cpu", 16, 64, training=True, steps=4)
    assert not faster("lstm", torch.float32, "cpu", 4, 1024, training=True, steps=16)
    assert faster("lstm", torch.float32, "cpu", 16, 1024, training=True, steps=16)
    # nn.LSTM on ATen's steps: packed training, 16 bits
    assert not faster("lstm", torch.float32, "cpu", 16, 64, training=True, steps=64, packed=True)
    assert faster("lstm", torch.float32, "cpu", 16, 64, steps=64, packed=True)
    assert not faster("lstm", torch.bfloat16, "cpu", 4, 1024, training=True, steps=256)
    assert faster("lstm", torch.bfloat16, "cpu", 4, 1024, steps=64)
    assert not faster("lstm", torch.float16, "cpu", 4, 256, steps=64)
    assert not faster("lstm", torch.float32, "cpu", 4, 1024, proj_size=256, training=True, steps=256)
    assert faster("lstm", torch.float32, "cpu", 4, 512, proj_size=128, steps=1)
    assert not faster("lstm", torch.float32, "cpu", 4, 256, proj_size=64, steps=256)
    assert not faster("rnn", torch.float32, "cpu", 1024, 1024)
    assert not faster("gru", torch.float32, "cpu", 1024, 1024)
    # Packed Elman and GRU forwards: nn's packed recurrence from H = 512 / 256; training stays ours.
    assert faster("gru", torch.float32, "cpu", 16, 256, steps=64, packed=True)
    assert not faster("gru", torch.float32, "cpu", 16, 255, steps=64, packed=True)
    assert not faster("gru", torch.float32, "cpu", 16, 1024, training=True, steps=64, packed=True)
    assert not faster("gru", torch.bfloat16, "cpu", 16, 1024, steps=64, packed=True)
    assert faster("rnn", torch.float32, "cpu", 4, 512, packed=True)
    assert not faster("rnn", torch.float32, "cpu", 4, 511, packed=True)
    assert not faster("rnn", torch.float32, "cpu", 4, 1024, training=True, packed=True)
    assert not faster("lstm", torch.float64, "cuda", 4096, 4096)  # the reference stays ours


@pytest.mark.parametrize("onednn", [True, False])
def test_cpu_bfloat16_lstm_follows_onednn(monkeypatch, onednn):
    """Where the CPU has oneDNN's bfloat16 LSTM (and oneDNN is enabled),
    nn.LSTM's bfloat16 calls run it: forwards go to nn, training too but
    from H = 1024 and the shortest calls at B = 1; elsewhere nn runs ATen's
    steps, and ours keeps training and forwards below H = 512."""
    monkeypatch.setattr(_crossover, "_CPU_HAS_ONEDNN_BFLOAT16", onednn)
    faster = _crossover.torch_runs
    assert faster("lstm", torch.bfloat16, "cpu", 4, 256, steps=64) is onednn
    assert faster("lstm", torch.bfloat16, "cpu", 4, 1024, steps=64)  # ATen's steps too, from H = 512
    assert faster("lstm", torch.bfloat16, "cpu", 16, 512, training=True, steps=64) is onednn
    assert not faster("lstm", torch.bfloat16, "cpu", 16, 1024, training=True, steps=64)
    assert not faster("lstm", torch.bfloat16, "cpu", 1, 256, training=True, steps=16)
    assert faster("lstm", torch.bfloat16, "cpu", 1, 256, training=True, steps=17) is onednn
    assert faster("lstm", torch.bfloat16, "cpu", 2, 256, training=True, steps=16) is onednn
    assert faster("lstm", torch.bfloat16, "cpu", 1, 128, training=True, steps=4) is onednn
    # nn runs ATen's steps with a projection or on packed input: as before
    assert not faster("lstm", torch.bfloat16, "cpu", 4, 256, proj_size=128, steps=64)
    assert not faster("lstm", torch.bfloat16, "cpu", 16, 512, training=True, steps=64, packed=True)
    assert not faster("lstm", torch.float16, "cpu", 4, 256, steps=64)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not faster("lstm", torch.bfloat16, "cpu", 4, 256, steps=64)


@pytest.mark.parametrize("autocast_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cuda_autocast_takes_16_bit_limits(monkeypatch, autocast_dtype):
    """Under 16-bit CUDA autocast a float32 module's call computes in 16 bits
    (ours in the autocast dtype, nn's on cuDNN in float16 whatever it is):
    the hand-over follows float16's limits, not float32's (B = 64 H = 1024:
    torch in float32, ours in 16 bits), nor bfloat16's under bfloat16
    autocast (H = 256 B = 256: ours in bfloat16, torch in float16). Another autocast dtype (torch.autocast takes any on
    CUDA) leaves the input's limits. Autocast's state is stubbed: this runs
    without a GPU."""
    runs = _crossover.torch_runs
    assert runs("rnn", torch.float32, "cuda", 64, 1024)
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: device_type == "cuda")
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: autocast_dtype)
    sixteen = autocast_dtype in (torch.float16, torch.bfloat16)
    assert runs("rnn", torch.float32, "cuda", 64, 1024) is not sixteen
    assert runs("rnn", torch.float32, "cuda", 256, 256)
    assert runs("rnn", torch.bfloat16, "cuda", 256, 256) is sixteen  # bfloat16's own limit: ours
    assert runs("rnn", torch.float32, "cuda", 512, 1024)
    for cell in ("lstm", "gru"):
        runs(cell, torch.float32, "cuda", 8, 512)  # a limit for every cell
    assert not runs("rnn", torch.float64, "cuda", 4096, 4096)  # float64: not autocast's


@pytest.mark.parametrize("clusters", [True, False])
def test_gated_limits_follow_the_cluster_family(monkeypatch, clusters):
    """The 16-bit gated cells' limits where the cluster family runs (sm_90
    and later), forward and training, the persistent family's elsewhere."""
    monkeypatch.setattr(_crossover, "_cluster_family_runs", lambda index: clusters)
    monkeypatch.setattr(_crossover, "_cudnn_persistent_device", lambda index: True)
    faster = _crossover.torch_runs
    assert faster("lstm", torch.float16, "cuda", 8, 256) != clusters  # cuDNN's persistent kernel, or ours
    assert faster("lstm", torch.float16, "cuda", 8, 1024) != clusters  # forwards: ours on clusters
    assert faster("lstm", torch.float16, "cuda", 8, 1024, training=True)
    assert faster("lstm", torch.float16, "cuda", 16, 1024)
    assert faster("gru", torch.bfloat16, "cuda", 56, 512) != clusters
    assert faster("gru", torch.bfloat16, "cuda", 64, 512)
    assert faster("lstm", torch.bfloat16, "cuda", 56, 512) != clusters
    assert faster("lstm", torch.float16, "cuda", 8, 256, training=True) != clusters
    assert faster("gru", torch.bfloat16, "cuda", 56, 512, training=True) != clusters
    assert faster("lstm", torch.bfloat16, "cuda", 64, 512, training=True)  # more clusters than the GPU holds
    assert not faster("lstm", torch.float32, "cuda", 64, 256)  # float32 has no cluster family


@pytest.mark.parametrize("device_allows", [True, False])
def test_float16_lstm_goes_to_cudnn_only_for_its_persistent_kernel(monkeypatch, device_allows):
    """cuDNN's float16 LSTM is its persistent kernel only where ATen's
    get_algo picks it (padded input, one layer and direction, sizes multiples
    of 128, hidden <= 1024, a batch a multiple of 8 up to 128, a device it
    allows; at hidden <= 192 its small-hidden one for any padded call);
    elsewhere it is the per-step algorithm, which ours beats as in
    bfloat16, and bfloat16's limits decide."""
    monkeypatch.setattr(_crossover, "_cluster_family_runs", lambda index: True)
    monkeypatch.setattr(_crossover, "_cudnn_persistent_device", lambda index: device_allows)
    faster = _crossover.torch_runs
    assert not faster("lstm", torch.float16, "cuda", 8, 1024)  # ours ahead of cuDNN's persistent forward
    assert faster("lstm", torch.float16, "cuda", 8, 1024, training=True) is device_allows
    for training in (False, True):
        assert faster("lstm", torch.float16, "cuda", 16, 768, training=training) is device_allows
        assert faster("lstm", torch.float16, "cuda", 64, 256, training=training) is device_allows
        assert not faster("lstm", torch.float16, "cuda", 8, 512, training=training)  # ours to 56 there
        for batch in (5, 6, 7, 9, 12, 15):  # not a multiple of 8: ours as bfloat16 to 16 at H = 1024
            assert not faster("lstm", torch.float16, "cuda", batch, 1024, training=training)
        assert faster("lstm", torch.float16, "cuda", 17, 1024, training=training)
        assert faster("lstm", torch.float16, "cuda", 24, 1024, training=training)
        for other in ({"layers": 2}, {"bidirectional": True}, {"packed": True}, {"input_size": 100}):
            assert not faster("lstm", torch.float16, "cuda", 16, 1024, training=training, **other), other
        assert not faster("lstm", torch.float16, "cuda", 16, 1000, training=training)
        assert faster("lstm", torch.float16, "cuda", 16, 1024, input_size=256, training=training) is device_allows
        assert faster("lstm", torch.float16, "cuda", 136, 256, training=training)  # past 128: bfloat16's 64
        assert not faster("gru", torch.float16, "cuda", 8, 1024, training=training)  # no persistent GRU
    # At hidden <= 192 cuDNN's small-hidden persistent kernel runs at any batch, layers, direction:
    # float16's limits (set against cuDNN's persistent kernels) stay, on clusters and without.
    for clusters in (True, False):
        monkeypatch.setattr(_crossover, "_cluster_family_runs", lambda index: clusters)
        for other in ({}, {"layers": 2}, {"bidirectional": True}, {"input_size": 100}):
            ours_to = 56 if clusters else 4
            assert not faster("lstm", torch.float16, "cuda", ours_to, 192, **other), (clusters, other)
            assert faster("lstm", torch.float16, "cuda", ours_to + 1, 192, **other), (clusters, other)


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("form", ["tensor", "batch_first", "packed", "bidirectional"])
def test_every_module_path_gives_the_hand_over_its_steps(cell, form, monkeypatch):
    """The hand-over's short-call limits need the call's T: every path of
    every module passes it (the padded length for packed input), and only
    the short path (prnn::layers) claims the few-steps kernel."""
    seen = []
    real = _crossover.torch_runs

    def spy(*args, **kwargs):
        seen.append((kwargs.get("steps"), kwargs.get("layers_op", False), kwargs.get("packed", False),
                     kwargs.get("input_size"), kwargs.get("layers"), kwargs.get("bidirectional")))
        return real(*args, **kwargs)

    monkeypatch.setattr(_crossover, "torch_runs", spy)
    cls = CELLS[cell][0]
    module = cls(3, 5, num_layers=2, batch_first=form == "batch_first", bidirectional=form == "bidirectional")
    x = torch.randn(4, 7, 3) if form == "batch_first" else torch.randn(7, 4, 3)
    if form == "packed":
        x = pack_padded_sequence(x, torch.tensor([7, 6, 6, 2]))
    module(x)
    assert seen == [(7, form in ("tensor", "batch_first"), form == "packed", 3, 2, form == "bidirectional")]


@pytest.mark.parametrize("cell,hidden", [("gru", 256), ("rnn", 512), ("lstm", 512)])
def test_compiled_cpu_packed_forwards_stay_ours(cell, hidden):
    """A packed forward that eager hands to nn on the CPU stays ours under
    torch.compile, where nn's packed recurrence (batch_sizes read as data)
    fails a fullgraph compile; the values are nn's all the same."""
    ours, ref = _pair(cell, "cpu", torch.float32, hidden=hidden)
    assert _crossover.torch_runs(cell, torch.float32, "cpu", 4, hidden, steps=6, packed=True)
    packed = pack_padded_sequence(torch.randn(6, 4, 5), torch.tensor([6, 5, 3, 2]))
    with torch.no_grad():
        y, h = torch.compile(ours, fullgraph=True, backend="eager")(packed)
        y_ref, h_ref = ref(packed)
    torch.testing.assert_close(y.data, y_ref.data, rtol=1e-5, atol=1e-6)
    for a, b in zip(h if isinstance(h, tuple) else (h,), h_ref if isinstance(h_ref, tuple) else (h_ref,)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_plan_says_what_a_module_runs():
    assert torch_prnn.plan(1024, batch=32, cell="lstm", device="cpu")["module"] == "torch"
    assert torch_prnn.plan(8, batch=1, cell="lstm", device="cpu")["module"] == "prnn"
    assert torch_prnn.plan(8, batch=1, steps=256, cell="lstm", device="cpu")["module"] == "torch"
    assert torch_prnn.plan(8, batch=1, steps=256, cell="lstm", device="cpu", backward=True,
                           lengths=True)["module"] == "prnn"
    assert torch_prnn.plan(1024, batch=32, cell="gru", device="cpu")["module"] == "prnn"
    assert torch_prnn.plan(8, batch=1, device="cpu")["module"] == "prnn"


def test_environment_turns_the_hand_over_off():
    code = ("import torch, torch_prnn; from torch_prnn import _crossover; "
            "print(_crossover.enabled, torch_prnn.plan(256, steps=256, cell='lstm', device='cpu')['module'])")
    rc, out = run_python(["-c", code], timeout=120, env_extra={"PRNN_TORCH_FALLBACK": "0"})
    assert rc == 0 and out.strip().splitlines()[-1] == "False prnn", out


def _pair(cell, device, dtype, hidden=6, **kwargs):
    ours_cls, nn_cls = CELLS[cell]
    ours = ours_cls(5, hidden, device=device, dtype=dtype, **kwargs)
    ref = nn_cls(5, hidden, device=device, dtype=dtype, **kwargs)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _assert_same_call(ours, ref, make_input, hx=None):
    """Forward and backward of both modules on the same input: equal bit for bit."""
    inputs = [make_input() for _ in range(2)]
    outs = []
    for module, x in zip((ours, ref), inputs):
        y, h = module(x, hx)
        data = y.data if isinstance(y, nn.utils.rnn.PackedSequence) else y
        states = list(h) if isinstance(h, tuple) else [h]
        grads = torch.autograd.grad(data.square().sum() + sum(s.square().sum() for s in states),
                                    [x.data if isinstance(x, nn.utils.rnn.PackedSequence) else x,
                                     *module.parameters()])
        outs.append((data, states, grads))
    (y0, s0, g0), (y1, s1, g1) = outs
    assert torch.equal(y0, y1)
    assert all(torch.equal(a, b) for a, b in zip(s0, s1))
    assert len(g0) == len(g1) and all(torch.equal(a, b) for a, b in zip(g0, g1))


@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "bidirectional": True, "batch_first": True},
                                    {"num_layers": 2, "dropout": 0.0, "bias": False}])
def test_cpu_lstm_is_nn_lstm(kwargs):
    ours, ref = _pair("lstm", "cpu", torch.float32, hidden=256, **kwargs)
    assert torch_prnn.plan(256, batch=3, steps=6, cell="lstm", device="cpu", backward=True)["module"] == "torch"
    shape = (3, 6, 5) if kwargs.get("batch_first") else (6, 3, 5)
    x = torch.randn(shape)
    _assert_same_call(ours, ref, lambda: x.clone().requires_grad_())
    # unbatched, and hx given
    u = torch.randn(6, 5)
    _assert_same_call(ours, ref, lambda: u.clone().requires_grad_())
    layers = ours.num_layers * (2 if ours.bidirectional else 1)
    hx = (torch.randn(layers, 3, ours.proj_size or 256), torch.randn(layers, 3, 256))
    _assert_same_call(ours, ref, lambda: x.clone().requires_grad_(), hx)


@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_cpu_lstm_packed_is_nn_lstm(enforce_sorted):
    """A packed forward hands over (nn's packed LSTM, bit for bit); a packed
    training call stays ours (nn's runs ATen's steps there, slower)."""
    ours, ref = _pair("lstm", "cpu", torch.float32, hidden=256, num_layers=2)
    x = torch.randn(6, 4, 5)
    lengths = torch.tensor([6, 5, 3, 1]) if enforce_sorted else torch.tensor([3, 6, 1, 5])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    with torch.no_grad():
        (y0, (h0, c0)), (y1, (h1, c1)) = ours(packed), ref(packed)
    assert torch.equal(y0.data, y1.data) and torch.equal(h0, h1) and torch.equal(c0, c1)
    plan = torch_prnn.plan(256, batch=4, steps=6, cell="lstm", device="cpu", backward=True, lengths=True)
    assert plan["module"] == "prnn"


def test_cpu_lstm_bad_input_errors_stay():
    ours, ref = _pair("lstm", "cpu", torch.float32, hidden=256)
    for bad in (torch.randn(4, 3, 7), torch.randn(4, 3, 5, 1)):
        with pytest.raises((RuntimeError, ValueError)) as ours_err:
            ours(bad)
        with pytest.raises((RuntimeError, ValueError)) as ref_err:
            ref(bad)
        assert type(ours_err.value) is type(ref_err.value)
    with pytest.raises(RuntimeError, match="Expected hidden"):
        ours(torch.randn(4, 3, 5), (torch.randn(1, 2, 256), torch.randn(1, 2, 256)))


class _VFCalls:
    """Stands for torch._VF: each call's arguments go to `calls`, then torch._VF runs it."""

    def __init__(self, calls):
        self.calls = calls

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, args))
            return getattr(torch._VF, name)(*args)
        return call


# A call of each form: (module keywords, input shape, lengths of a packed input or None).
FORMS = {
    "time-major": ({}, (4, 3, 5), None),
    "batch-first": ({"batch_first": True}, (3, 4, 5), None),
    "unbatched": ({}, (4, 5), None),
    "two directions": ({"bidirectional": True}, (4, 3, 5), None),
    "packed": ({}, (4, 3, 5), torch.tensor([2, 4, 1])),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_hand_over_is_nns_call_on_the_modules_parameters(cell, form, monkeypatch):
    """A handed-over call is one torch._VF call with nn's arguments, given the
    module's parameters themselves in nn's order: on CUDA those are the views
    of the buffer flatten_parameters made, which cuDNN takes without copying
    them (a list rebuilt from copies, or in another order, would be compacted
    on every call, with cuDNN's warning)."""
    monkeypatch.setattr(_crossover, "cpu_torch_runs", lambda *args: True)  # every call handed over
    kwargs, shape, lengths = FORMS[form]
    packed = lengths is not None
    x = torch.randn(shape)

    def make_input():
        leaf = x.clone().requires_grad_()
        return pack_padded_sequence(leaf, lengths, enforce_sorted=False) if packed else leaf

    ours, ref = _pair(cell, "cpu", torch.float32, num_layers=2, **kwargs)
    assert ours._flat_weights_names == ref._flat_weights_names
    ours_calls, nn_calls = [], []
    monkeypatch.setattr(_crossover, "_VF_OF_MODE", {mode: getattr(_VFCalls(ours_calls), run.__name__)
                                                    for mode, run in _crossover._VF_OF_MODE.items()})
    monkeypatch.setattr(torch.nn.modules.rnn, "_VF", _VFCalls(nn_calls))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _assert_same_call(ours, ref, make_input)
    assert len(ours_calls) == len(nn_calls) == 1
    (name, args), (nn_name, nn_args) = ours_calls[0], nn_calls[0]
    assert name == nn_name and len(args) == len(nn_args)
    weights_at = 3 if packed else 2
    for i, (arg, nn_arg) in enumerate(zip(args, nn_args)):
        if i == weights_at:  # each module's own parameters, the very tensors
            for module, passed in ((ours, arg), (ref, nn_arg)):
                params = [module._parameters[name] for name in module._flat_weights_names]
                assert len(passed) == len(params) and all(w is p for w, p in zip(passed, params))
        elif isinstance(arg, (tuple, list)):  # LSTM's (h, c)
            assert len(arg) == len(nn_arg) and all(torch.equal(a, b) for a, b in zip(arg, nn_arg))
        elif isinstance(arg, torch.Tensor):  # the input (the same values: a copy each), hx, batch_sizes
            assert arg.shape == nn_arg.shape and arg.stride() == nn_arg.stride() and torch.equal(arg, nn_arg)
        else:
            assert arg == nn_arg, i


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_cuda_large_batch_is_nn(cell):
    batch = 1024
    assert torch_prnn.plan(6, batch=batch, cell=cell, device="cuda", backward=True)["module"] == "torch"
    ours, ref = _pair(cell, "cuda", torch.float32, num_layers=2)
    # nn's own modules are flattened at creation; ours are too, so cuDNN takes them as they are.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cuDNN's "not part of single contiguous chunk" would raise
        x = torch.randn(3, batch, 5, device="cuda")
        _assert_same_call(ours, ref, lambda: x.clone().requires_grad_())
        lengths = torch.randint(1, 4, (batch,))
        _assert_same_call(ours, ref, lambda: pack_padded_sequence(x.clone().requires_grad_(), lengths,
                                                                  enforce_sorted=False))
        ours.cpu().cuda()  # flattened again after a move
        ref.cpu().cuda()
        _assert_same_call(ours, ref, lambda: x.clone().requires_grad_())


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_cuda_parameters_are_one_cudnn_buffer_in_every_dtype(cell, dtype):
    # bfloat16 too, which nn's flatten_parameters leaves as it is (nn's bfloat16 modules
    # compact their weights on every call, with cuDNN's warning; ours do not).
    hidden = 1600 if cell == "rnn" and dtype != torch.float32 else 6  # 16-bit Elman stays ours to H = 1536
    ours, ref = _pair(cell, "cuda", dtype, hidden=hidden, num_layers=2)
    converted = getattr(CELLS[cell][0], {"rnn": "from_rnn", "lstm": "from_lstm", "gru": "from_gru"}[cell])(ref)
    for module in (ours, converted, ours.float().to(dtype)):
        assert len({p.untyped_storage().data_ptr() for p in module.parameters()}) == 1
    batch = 1024
    assert torch_prnn.plan(hidden, batch=batch, dtype=dtype, cell=cell, device="cuda", backward=True)["module"] == "torch"
    x = torch.randn(3, batch, 5, device="cuda", dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _assert_same_call(ours, ref, lambda: x.clone().requires_grad_())
    assert not [w for w in caught if "torch_prnn" in w.filename], [str(w.message) for w in caught]


@needs_cuda
def test_cuda_parameters_share_one_buffer_and_load_both_ways():
    ours, ref = _pair("lstm", "cuda", torch.float32, num_layers=2, bidirectional=True)
    storages = {p.untyped_storage().data_ptr() for p in ours.parameters()}
    assert len(storages) == 1
    ref.load_state_dict(ours.state_dict())
    ours.load_state_dict(ref.state_dict())
    assert len({p.untyped_storage().data_ptr() for p in ours.parameters()}) == 1


def test_cpu_lstm_one_step_no_grad_is_nn_lstm():
    # The eager one-timestep call (torch_prnn/_short.py) hands over as the regular path does.
    ours, ref = _pair("lstm", "cpu", torch.float32, hidden=256, num_layers=2)
    x, state = torch.randn(1, 8, 5), (torch.randn(2, 8, 256), torch.randn(2, 8, 256))  # B * H past ours
    with torch.no_grad():
        (y0, (h0, c0)), (y1, (h1, c1)) = ours(x, state), ref(x, state)
    assert torch.equal(y0, y1) and torch.equal(h0, h1) and torch.equal(c0, c1)
