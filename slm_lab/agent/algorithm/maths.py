"""Small value transforms shared by algorithms' losses."""
from __future__ import annotations

import torch


def symlog(x: torch.Tensor) -> torch.Tensor:
    """symlog(x) = sign(x) * ln(1 + |x|): near x for small |x|, logarithmic for large ones
    (DreamerV3), so value targets of very different scales weigh alike in the value loss."""
    return torch.sign(x) * torch.log1p(x.abs())
