"""Type aliases of the public signatures (checked by mypy in ``make test``; nothing here runs at import cost).

``TensorLike``: what the array arguments accept: a torch tensor, a numpy array, or anything ``np.asarray`` reads
(nested lists, scalars); the functions convert it themselves (``_inputs.py``).
``DeviceLike``: a torch device or its name (``"cpu"``, ``"cuda:0"``).
"""

from __future__ import annotations

from typing import Union

import numpy.typing as npt
import torch

TensorLike = Union[torch.Tensor, npt.ArrayLike]
DeviceLike = Union[torch.device, str]

__all__ = ["TensorLike", "DeviceLike"]
