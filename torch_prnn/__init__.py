"""torch_prnn: persistent-kernel Elman RNNs for PyTorch.

``import torch_prnn`` registers the ``torch.ops.prnn`` ops; swap
``torch.nn.RNN`` for :class:`torch_prnn.PersistentRNN`.
"""

import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _C, ops  # noqa: F401  (registers the ops, their fake kernels and autograd)
from .ops import plan
from .rnn import PersistentRNN

# Whole-model checkpoints (torch.save(model)) load under torch.load's default
# weights_only=True with the allow-list the same model with nn.RNN needs:
# torch_prnn's classes are allowed here.
torch.serialization.add_safe_globals([PersistentRNN])

__version__ = "0.1.0"
__all__ = ["PersistentRNN", "plan", "__version__"]
