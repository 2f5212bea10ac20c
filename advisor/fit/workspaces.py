"""Workspaces a kernel sizes at run time, which its fake implementation leaves empty, and
outputs a kernel over-allocates, which its fake implementation sizes to their shape.

oneDNN's LSTM/GRU layer (``aten.mkldnn_rnn_layer``, what ``nn.LSTM`` runs on the CPU in training)
returns a workspace its backward reads: every time step's gates and states, laid out and padded as
oneDNN chooses. PyTorch's meta kernel returns an empty one, so a fit of the zoo's word-language
LSTM saw 0.47 MB of the layer's 3.2 MB of saved activations (-29% on the step's peak). When the
target is this machine's CPU, ``real_workspace_bytes`` runs the op once for real on zeros of the
same shapes (once per distinct call, at most ``MAX_PROBE_BYTES`` of inputs) and the fit gives the
fake call a workspace of that size; otherwise (a larger layer, another target) the meta's stands.

Some reduced losses on the CPU (``mse_loss``, ``smooth_l1_loss``, ``soft_margin_loss``) return their
0-dim loss in the storage of the unreduced one (a batch of 32: 128 bytes, not 4), and a script that
keeps its loss into the next step holds it: the zoo's regression fit read 124 bytes under the
measured 1,980. For those ops ``with_real_output_storage`` measures the real output's storage the
same way and gives the fake output one of that size (its shape unchanged).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

MAX_PROBE_BYTES = 256 * 2**20  # the real inputs a probe may allocate

# op -> index of its workspace output
WORKSPACE_OUTPUT = {torch.ops.aten.mkldnn_rnn_layer.default: 3}

# ops whose real CPU output may own more storage than its shape needs (probed, never assumed)
OUTPUT_STORAGE_PROBED = frozenset({torch.ops.aten.mse_loss.default, torch.ops.aten.smooth_l1_loss.default,
                                   torch.ops.aten.soft_margin_loss.default})

_sizes: dict[tuple, int | None] = {}
_output_sizes: dict[tuple, int | None] = {}


def _key(args: tuple) -> tuple:
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else
                 tuple(a) if isinstance(a, list) else a for a in args)


def with_real_workspace(func: Any, args: Any, out: Any) -> Any:
    """``out`` (the fake call's outputs) with its workspace as large as the real kernel's on this
    CPU, when that differs and could be measured."""
    size = real_workspace_bytes(func, tuple(args))
    index = WORKSPACE_OUTPUT[func]
    workspace = out[index]
    if size is None or size == workspace.numel() * workspace.element_size():
        return out
    resized = workspace.new_empty((size // workspace.element_size(),))
    return (*out[:index], resized, *out[index + 1:])


def real_workspace_bytes(func: Any, args: tuple) -> int | None:
    """The workspace's size in bytes when ``func`` runs for real on zeros shaped as ``args``;
    None when the probe would allocate too much or fails."""
    key = (func, torch.is_grad_enabled(), _key(args))  # without grad the kernel keeps no workspace
    if key not in _sizes:
        _sizes[key] = _probe(func, args)
    return _sizes[key]


def _probe(func: Any, args: tuple) -> int | None:
    def workspace_bytes(out: Any) -> int:
        workspace = out[WORKSPACE_OUTPUT[func]]
        return 0 if workspace is None else workspace.numel() * workspace.element_size()

    # None: a build without oneDNN, say: the meta's workspace stands
    return _on_real_zeros(func, args, {}, workspace_bytes)


def _on_real_zeros(func: Any, args: tuple, kwargs: Any, measure: Any) -> int | None:
    """``measure(out)`` of ``func`` run for real, outside the fake mode, on zeros shaped as ``args``'
    tensors; None when that would allocate more than ``MAX_PROBE_BYTES`` or the kernel fails."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if sum(t.numel() * t.element_size() for t in tensors) > MAX_PROBE_BYTES:
        return None
    with unset_fake_temporarily():
        real = [torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
        try:
            out = func(*real, **kwargs)
        except RuntimeError:
            return None
        return measure(out)


def with_real_output_storage(func: Any, args: Any, kwargs: Any, out: Any) -> Any:
    """``out`` (a fake 0-or-more-dim tensor) owning a storage as large as the real kernel's output
    on this CPU, when that is larger and could be measured."""
    if not isinstance(out, torch.Tensor):
        return out
    key = (func, _key(tuple(args)), tuple(sorted(kwargs.items())))
    if key not in _output_sizes:
        _output_sizes[key] = _probe_output(func, tuple(args), kwargs)
    size = _output_sizes[key]
    if size is None or size <= out.untyped_storage().nbytes():
        return out
    owned = out.new_empty((size // out.element_size(),))
    owned.resize_(out.shape)  # a smaller shape keeps the storage, as the real kernel's output does
    return owned


def _probe_output(func: Any, args: tuple, kwargs: Any) -> int | None:
    return _on_real_zeros(func, args, kwargs,
                          lambda out: out.untyped_storage().nbytes() if isinstance(out, torch.Tensor) else None)
