"""FLOPs and minimum bytes of common ops from recorded shapes alone, without torch.

The agent counts with ``advisor.probes.compute.formulas`` (torch's flop registry on live
tensors); an imported trace only has each op's ``Input Dims`` and ``Input type``, and the
controller must not import torch. This table covers the ops that dominate training time
with the same conventions (2 FLOPs per multiply-add, the bias add as one FLOP per output
element, each input read once and the output written once); any other op gets 0 FLOPs and,
where shapes were recorded, the bytes of its tensor inputs plus an output as large as its
largest input. Figures are estimates for ops whose shapes alone do not fix the output
(convolutions read stride, padding and dilation from ``Concrete Inputs`` when present).
"""

from __future__ import annotations

import ast
import math
from typing import Any, Sequence

# Kineto's ``Input type`` strings (c10 scalar type names) -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
# The same names as the agent's OpStat.dtype (torch dtype names without "torch.").
DTYPE_NAMES: dict[str, str] = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool", "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
}

# FLOPs per output element of elementwise ops (a subset of the agent's PER_ELEMENT table).
PER_ELEMENT: dict[str, float] = {
    **{n: 1.0 for n in ("add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_",
                        "neg", "sqrt", "rsqrt", "exp", "log", "tanh", "clamp", "clamp_min", "where",
                        "threshold_backward", "maximum", "minimum", "pow", "_foreach_add_",
                        "_foreach_mul_", "_foreach_div_", "_foreach_sqrt", "_foreach_add",
                        "_foreach_mul", "_foreach_div")},
    **{n: 3.0 for n in ("addcmul_", "addcdiv_", "lerp_", "addcmul", "addcdiv", "lerp",
                        "_foreach_addcmul_", "_foreach_addcdiv_", "_foreach_lerp_")},
    "sigmoid": 4.0, "silu": 5.0, "silu_backward": 8.0, "gelu": 8.0, "gelu_backward": 12.0,
    "_softmax": 5.0, "_log_softmax": 5.0, "_softmax_backward_data": 4.0,
    "_log_softmax_backward_data": 3.0, "native_layer_norm": 8.0, "native_layer_norm_backward": 10.0,
    "native_batch_norm": 8.0, "native_batch_norm_backward": 10.0, "native_dropout": 2.0,
    "_fused_adam_": 16.0, "_fused_adamw_": 16.0,
}
MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"})
CONVS = frozenset({"conv1d", "conv2d", "conv3d", "convolution", "_convolution"})
ATTENTION = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                       "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
                       "_efficient_attention_forward"})
FORMULA_OPS = MATMULS | CONVS | ATTENTION | frozenset(PER_ELEMENT)


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _tensor_shapes(dims: Sequence[Any]) -> list[list[int]]:
    """The non-empty shapes among an op's recorded input dims (tensor lists flattened)."""
    out: list[list[int]] = []
    for d in dims:
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append(list(d))
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            out.extend(list(x) for x in d if x and all(isinstance(v, int) for v in x))
    return out


def _broadcast(a: Sequence[int], b: Sequence[int]) -> list[int]:
    n = max(len(a), len(b))
    a = [1] * (n - len(a)) + list(a)
    b = [1] * (n - len(b)) + list(b)
    return [max(x, y) for x, y in zip(a, b)]


def _matmul(name: str, shapes: list[list[int]]) -> tuple[int, list[int]] | None:
    """(FLOPs, output shape) of a matmul-like op, or None when the shapes do not fit."""
    if name == "linear" and len(shapes) >= 2:
        x, w = shapes[0], shapes[1]
        if len(w) != 2 or not x or x[-1] != w[1]:
            return None
        out = [*x[:-1], w[0]]
        return 2 * _numel(x[:-1]) * w[1] * w[0] + (_numel(out) if len(shapes) > 2 else 0), out
    if name in ("addmm", "baddbmm"):
        shapes = shapes[1:]  # the added input (bias) first
    if len(shapes) < 2:
        return None
    a, b = shapes[0], shapes[1]
    if len(a) == 1:
        a = [1, a[0]]
    if len(b) == 1:
        b = [b[0], 1]
    if a[-1] != b[-2]:
        return None
    batch = _broadcast(a[:-2], b[:-2])
    m, k, n = a[-2], a[-1], b[-1]
    out = [*batch, m, n]
    flops = 2 * _numel(batch) * m * k * n
    if name in ("addmm", "baddbmm"):
        flops += _numel(out)
    return flops, out


def _ints(text: str) -> list[int] | None:
    if len(text) > 256:  # stride, padding or dilation: a few small integers, never more
        return None
    try:
        value = ast.literal_eval(text) if text else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _conv(shapes: list[list[int]], concrete: Sequence[Any]) -> tuple[int, list[int]] | None:
    if len(shapes) < 2:
        return None
    x, w = shapes[0], shapes[1]
    spatial = len(w) - 2
    if spatial < 1 or len(x) != spatial + 2:
        return None
    text = [str(c) for c in concrete] + [""] * 8
    has_bias = len(shapes) > 2 and len(shapes[2]) == 1
    # conv2d(input, weight, bias, stride, padding, dilation, groups): scalars in Concrete Inputs.
    stride = _ints(text[3]) or [1]
    padding = _ints(text[4]) or [0]
    dilation = _ints(text[5]) or [1]
    out_spatial = []
    for i in range(spatial):
        s, p, d = (v[i] if len(v) > i else v[0] for v in (stride, padding, dilation))
        out_spatial.append(max(0, (x[2 + i] + 2 * p - d * (w[2 + i] - 1) - 1) // max(s, 1) + 1))
    out = [x[0], w[0], *out_spatial]
    flops = 2 * _numel(out) * w[1] * _numel(w[2:])
    if has_bias:
        flops += _numel(out)
    return flops, out


def op_cost(name: str, dims: Sequence[Any], types: Sequence[str], concrete: Sequence[Any] = ()) -> tuple[int, int]:
    """(FLOPs, bytes) of one call of aten op ``name`` (without the ``aten::`` prefix).

    ``dims``, ``types`` and ``concrete`` are the trace's ``Input Dims``, ``Input type`` and
    ``Concrete Inputs``. Returns (0, 0) when no tensor shape was recorded.
    """
    shapes = _tensor_shapes(dims)
    if not shapes:
        return 0, 0
    size = next((DTYPE_BYTES[t] for t in types if t in DTYPE_BYTES), 4)
    read = sum(_numel(s) for s in shapes) * size
    out_shape: list[int] | None = None
    flops = 0
    if name in MATMULS:
        found = _matmul(name, shapes)
        if found:
            flops, out_shape = found
    elif name in CONVS:
        found = _conv(shapes, concrete)
        if found:
            flops, out_shape = found
    elif name in ATTENTION and len(shapes) >= 3:
        q, k, v = shapes[0], shapes[1], shapes[2]
        if len(q) >= 2 and len(k) >= 2 and len(v) >= 2:
            # Two matmuls per head: Q K^T (L x E by E x S) and P V (L x S by S x Ev).
            flops = 2 * _numel(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])
            out_shape = [*q[:-1], v[-1]]
    elif name in PER_ELEMENT and name.startswith("_foreach"):
        # One output per tensor of the first list (the lists are flattened in ``shapes``).
        first = next((d for d in dims if isinstance(d, list) and d and isinstance(d[0], list)), [])
        out_shape = [sum(_numel(s) for s in _tensor_shapes([first]))]
        flops = int(PER_ELEMENT[name] * out_shape[0])
    elif name in PER_ELEMENT:
        out_shape = shapes[0]
        for s in shapes[1:]:
            out_shape = _broadcast(out_shape, s)
        flops = int(PER_ELEMENT[name] * _numel(out_shape))
    if out_shape is None:
        out_shape = max(shapes, key=_numel)
    written = _numel(out_shape) * size
    return int(flops), int(read + written)
