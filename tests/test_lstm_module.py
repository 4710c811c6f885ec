"""PersistentLSTM against torch.nn.LSTM with the same weights (the shared
tests in gated_cells.CellTests), and what only LSTM has: projections
(proj_size) and hx as (h_0, c_0)."""

import pytest
import torch

import torch_prnn
from conftest import devices
from gated_cells import DTYPES, CellTests, check_parity, make_input

# nn.LSTM on the CPU says so whenever it runs a projection.
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")


class TestLSTM(CellTests):
    ours = torch_prnn.PersistentLSTM
    theirs = torch.nn.LSTM
    proj_sizes = (0, 3)

    def hx_of(self, h):
        return h, torch.randn_like(h)

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("H,P", [(2, 1), (7, 6), (33, 5), (129, 16)])
    def test_projection_sizes(self, device, dtype, H, P):
        ours, reference = self.twins(device, dtype, input_size=5, hidden_size=H, proj_size=P, num_layers=2, bidirectional=True)
        check_parity(ours, reference, make_input(4, 3, 5, False, dtype, device), self.make_hx(ours, 3, device))

    BAD_STATES = [
        ("c shape", lambda: (torch.randn(4, 3, 7), torch.randn(4, 3, 6))),
        ("c rank", lambda: (torch.randn(4, 3, 7), torch.randn(3, 7))),
        ("three states", lambda: (torch.randn(4, 3, 7),) * 3),
        ("h with the projection's size missing", lambda: (torch.randn(4, 3, 6), torch.randn(4, 3, 7))),
    ]

    @pytest.mark.parametrize("device", devices)
    @pytest.mark.parametrize("name,make", BAD_STATES, ids=[c[0] for c in BAD_STATES])
    def test_bad_states_match_nn(self, device, name, make):
        self.check_bad_call(device, torch.randn(5, 3, 4), make())

    @pytest.mark.parametrize("shape", [(2, 3, 7), (2, 2, 3, 7)], ids=["3-D", "h and c stacked"])
    def test_hx_as_one_tensor_is_refused(self, shape):
        """hx as one tensor (nn.LSTM raises on it too) is a TypeError naming
        hx, not unpacked along its first dimension into h and c."""
        lstm = torch_prnn.PersistentLSTM(4, 7, num_layers=2)
        for x in (torch.randn(5, 3, 4), torch.randn(5, 4)):
            with pytest.raises(TypeError, match=r"^PersistentLSTM: hx must be a tuple \(h_0, c_0\)"):
                lstm(x, torch.zeros(shape))

    def test_hx_of_fewer_than_two_states_is_an_index_error(self):
        """nn.LSTM raises IndexError reading hx[1]; ours too, naming hx."""
        lstm, reference = torch_prnn.PersistentLSTM(4, 7), torch.nn.LSTM(4, 7)
        x = torch.randn(5, 3, 4)
        for hx in ((torch.zeros(1, 3, 7),), ()):
            with pytest.raises(IndexError):
                reference(x, hx)
            with pytest.raises(IndexError, match=rf"^PersistentLSTM: hx must be a tuple \(h_0, c_0\) of two tensors, got {len(hx)}$"):
                lstm(x, hx)

    def test_projection_state_shapes(self):
        lstm = torch_prnn.PersistentLSTM(4, 7, num_layers=2, proj_size=3, bidirectional=True)
        output, (h_n, c_n) = lstm(torch.randn(5, 2, 4))
        assert output.shape == (5, 2, 6) and h_n.shape == (4, 2, 3) and c_n.shape == (4, 2, 7)
        assert lstm.weight_hr_l1_reverse.shape == (3, 7) and lstm.weight_hh_l1.shape == (28, 3)
