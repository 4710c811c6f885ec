"""torch_prnn: persistent-kernel recurrent layers (Elman RNN, LSTM, GRU) for PyTorch.

``import torch_prnn`` registers the ``torch.ops.prnn`` ops; swap
``torch.nn.RNN``, ``torch.nn.LSTM`` and ``torch.nn.GRU`` for
:class:`torch_prnn.PersistentRNN`, :class:`torch_prnn.PersistentLSTM` and
:class:`torch_prnn.PersistentGRU`; :class:`torch_prnn.Stream` keeps a module
resident on the GPU for one timestep a call.
"""

import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _build_check

_build_check.check()  # before _C: under another torch it would fail on an undefined symbol, or crash

from . import _C, ops  # noqa: E402, F401  (registers the ops, their fake kernels and autograd)
from .gru import PersistentGRU  # noqa: E402
from .lstm import PersistentLSTM  # noqa: E402
from .ops import plan  # noqa: E402
from .rnn import PersistentRNN  # noqa: E402
from .stream import Stream  # noqa: E402

# Whole-model checkpoints (torch.save(model)) load under torch.load's default
# weights_only=True with the allow-list the same model with nn's modules needs:
# torch_prnn's classes are allowed here.
torch.serialization.add_safe_globals([PersistentRNN, PersistentLSTM, PersistentGRU])

__version__ = "0.1.0"
__all__ = ["PersistentRNN", "PersistentLSTM", "PersistentGRU", "Stream", "plan", "__version__"]
