"""PersistentGRU against torch.nn.GRU with the same weights (the shared
tests in gated_cells.CellTests), and GRU's refusal of proj_size."""

import pytest
import torch

import torch_prnn
from gated_cells import CellTests


class TestGRU(CellTests):
    ours = torch_prnn.PersistentGRU
    theirs = torch.nn.GRU

    def test_unexpected_keyword(self):
        with pytest.raises(TypeError, match=r"^PersistentGRU.__init__\(\) got an unexpected keyword argument 'cell'$"):
            torch_prnn.PersistentGRU(3, 5, cell="lstm")