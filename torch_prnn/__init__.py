"""torch_prnn: persistent-kernel recurrent layers (Elman RNN, LSTM, GRU) for PyTorch.

``import torch_prnn`` registers the ``torch.ops.prnn`` ops; swap
``torch.nn.RNN``, ``torch.nn.LSTM`` and ``torch.nn.GRU`` for
:class:`torch_prnn.PersistentRNN`, :class:`torch_prnn.PersistentLSTM` and
:class:`torch_prnn.PersistentGRU`.
"""

import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _C, ops  # noqa: F401  (registers the ops, their fake kernels and autograd)
from .ops import plan
from .gru import PersistentGRU
from .lstm import PersistentLSTM
from .rnn import PersistentRNN

__version__ = "0.1.0"
__all__ = ["PersistentRNN", "PersistentLSTM", "PersistentGRU", "plan", "__version__"]
