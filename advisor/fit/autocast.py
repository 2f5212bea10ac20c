"""CUDA autocast for a fit's fake tensors, which are CPU tensors to PyTorch's dispatcher.

PyTorch's CUDA autocast casts at the ``AutocastCUDA`` dispatch key, which a fit's tensors never
reach (``advisor.fit.tensors``). While the script has CUDA autocast on, the CPU's autocast is
switched on with the same dtype (``mirror_autocast``): it casts above autograd, in nested calls
too, and caches the casts of parameters within the region, as CUDA's does. Where the two policies
differ, the calls the script makes are corrected to CUDA's (``CudaPolicy``): CUDA computes
softmax, layer norm, exp, log, pow, sums and the losses in float32 where the CPU keeps the lower
precision, and it casts a few matrix products the CPU leaves alone. Those corrections apply to the
calls the script's own code makes (a call inside a ``torch.nn.functional`` helper is left as the
CPU's policy does it). The op lists are torch 2.13's ``autocast_mode.cpp``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from advisor.fit.patches import Patches

# CUDA casts these to the autocast dtype; the CPU's list lacks them.
LOWER_ONLY_ON_CUDA = frozenset({
    "addmv", "addr", "mv", "einsum", "chain_matmul", "multi_dot", "linalg_multi_dot",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
})
# CUDA runs these in float32; the CPU's autocast leaves them in the input's precision.
FLOAT32_ON_CUDA = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "__rtruediv__", "__rdiv__", "softplus",
    "layer_norm", "group_norm", "norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "normalize", "dist", "pdist", "renorm", "logsumexp",
})
# CUDA gives these a float32 output (``dtype=``) unless the call names one.
FLOAT32_OUTPUT_ON_CUDA = frozenset({"softmax", "log_softmax", "softmin", "cumprod", "cumsum", "prod", "sum"})

_LOWER = (torch.float16, torch.bfloat16)


def _eligible(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


class CudaPolicy:
    """Corrects the script's calls to CUDA autocast's policy while CUDA autocast is on."""

    @staticmethod
    def cast(name: str, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        """The call's arguments under CUDA's policy, or None when it needs no correction."""
        if not torch.is_autocast_enabled("cuda"):
            return None
        if name in LOWER_ONLY_ON_CUDA:
            dtype = torch.get_autocast_dtype("cuda")
            return _cast_all((args, kwargs), lambda t: t.dtype != dtype, dtype)
        if name in FLOAT32_ON_CUDA:
            return _cast_all((args, kwargs), lambda t: t.dtype in _LOWER, torch.float32)
        if name in FLOAT32_OUTPUT_ON_CUDA and kwargs.get("dtype") is None:
            first = next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)), None)
            if first is not None and first.dtype in _LOWER:
                return args, {**kwargs, "dtype": torch.float32}
        return None


def _cast_all(value: tuple[tuple, dict[str, Any]], wanted: Any, dtype: torch.dtype) -> tuple[tuple, dict[str, Any]]:
    def cast(item: Any) -> Any:
        return item.to(dtype) if _eligible(item) and wanted(item) else item

    args, kwargs = tree_map(cast, value)
    return tuple(args), dict(kwargs)


def mirror_autocast(patches: Patches) -> None:
    """While a ``torch.autocast("cuda", ...)`` region is entered, the CPU's autocast is on with
    its dtype (and its previous state comes back at the region's exit)."""
    cls = torch.amp.autocast_mode.autocast
    enter, leave = cls.__enter__, cls.__exit__

    def __enter__(self: Any) -> Any:
        result = enter(self)
        if self.device == "cuda":
            self._advisor_fit_cpu = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
            torch.set_autocast_enabled("cpu", bool(self._enabled))
            if self.fast_dtype in _LOWER:
                torch.set_autocast_dtype("cpu", self.fast_dtype)
        return result

    def __exit__(self: Any, *exc: Any) -> Any:
        result = leave(self, *exc)
        previous = getattr(self, "_advisor_fit_cpu", None)
        if previous is not None:
            torch.set_autocast_enabled("cpu", previous[0])
            torch.set_autocast_dtype("cpu", previous[1])
        return result

    patches.set(cls, "__enter__", __enter__)
    patches.set(cls, "__exit__", __exit__)
