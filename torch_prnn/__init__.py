"""torch_prnn: persistent-kernel Elman RNNs for PyTorch.

``import torch_prnn`` registers the ``torch.ops.prnn`` ops; swap
``torch.nn.RNN`` for :class:`torch_prnn.PersistentRNN`; :class:`torch_prnn.Stream`
keeps a module resident on the GPU for one timestep a call.
"""

import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _C, ops  # noqa: F401  (registers the ops, their fake kernels and autograd)
from .ops import plan
from .rnn import PersistentRNN
from .stream import Stream

__version__ = "0.1.0"
__all__ = ["PersistentRNN", "Stream", "plan", "__version__"]
