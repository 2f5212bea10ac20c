"""FLOPs and minimum bytes moved per aten op call.

FLOPs
-----
Matmuls, convolutions and attention use ``torch.utils.flop_counter.flop_registry``
(2 FLOPs per multiply-add). Its registry lacks the CPU attention kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, so we add
both with the registry's own ``sdpa_flop_count`` / ``sdpa_backward_flop_count``
(full, non-causal count, as the registry does for the CUDA kernels), and the
CPU LSTM kernel ``aten.mkldnn_rnn_layer`` and its backward (``rnn_layer_flops``).

The registry counts every other op as zero. We count them per element with the
costs in ``PER_ELEMENT`` below (elements of the op's largest output, or of its
largest input for reductions), e.g. 1 for add/mul/relu, 8 for GELU forward,
8 for layer norm forward. Pure data movement (copies, casts, gathers, fills,
views) costs 0 FLOPs. Any other op tagged ``torch.Tag.pointwise`` counts 1 per
output element.

Bytes
-----
The minimum traffic: each distinct input tensor read once (a broadcast input,
with zero strides, counts its distinct elements only) and each output written
once. Views, aliases and metadata ops move nothing. An in-place op reads its
target once and writes it once; an ``out=`` argument is only written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import flop_counter

aten = torch.ops.aten


def _register_missing_formulas() -> None:
    """Add the CPU flash-attention formulas the registry lacks (checked on torch 2.13)."""
    fwd = aten._scaled_dot_product_flash_attention_for_cpu
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(fwd)
        def _cpu_flash_fwd(query, key, value, *args: Any, out_shape=None, **kwargs: Any) -> int:
            # Inputs are (batch, heads, seq, head_dim), the layout sdpa_flop_count expects.
            return flop_counter.sdpa_flop_count(query, key, value)

    if bwd not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(bwd)
        def _cpu_flash_bwd(grad_out, query, key, value, *args: Any, out_shape=None, **kwargs: Any) -> int:
            return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


_register_missing_formulas()

# Elementwise FLOPs per hidden unit per time step of one LSTM cell: three sigmoid gates (4
# each), tanh of the cell input (1), c = f*c + i*g (3), tanh(c) (1), h = o*tanh(c) (1).
LSTM_CELL_POINTWISE = 18
_LSTM_MODE = 2  # the cuDNN/oneDNN mode numbering: RNN_RELU 0, RNN_TANH 1, LSTM 2, GRU 3


def rnn_layer_flops(input_shape: Any, w_ih_shape: Any, w_hh_shape: Any, *, mode: int, has_biases: bool) -> int:
    """Forward FLOPs of one RNN layer in one direction over the whole sequence.

    Rows N = time steps x batch (packed sequences included: the input's leading elements over
    its feature size); gates G = rows of the input weight (4H for an LSTM). Per row: the input
    and hidden matmuls 2G(I + H), their sum G, the biases 2G, and for an LSTM the cell's
    ``LSTM_CELL_POINTWISE`` FLOPs per hidden unit.
    """
    gates, in_features = int(w_ih_shape[0]), int(w_ih_shape[1])
    hidden = int(w_hh_shape[1])
    rows = 1
    for d in input_shape[:-1]:
        rows *= int(d)
    per_row = 2 * gates * (in_features + hidden) + gates + (2 * gates if has_biases else 0)
    if mode == _LSTM_MODE:
        per_row += LSTM_CELL_POINTWISE * hidden
    return rows * per_row


def _register_rnn_formulas() -> None:
    """The oneDNN LSTM kernel CPU ``nn.LSTM`` runs (``aten.mkldnn_rnn_layer``) and its
    backward have no formula in the registry (torch 2.13); without them a word-level LSTM
    model loses half its FLOPs and reads as memory-bound (issue 21, item 13)."""
    fwd = getattr(aten, "mkldnn_rnn_layer", None)
    bwd = getattr(aten, "mkldnn_rnn_layer_backward", None)
    if fwd is not None and fwd not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(fwd)
        def _rnn_layer(input, weight0, weight1, weight2, weight3, hx, cx, reverse, batch_sizes, mode,
                       hidden_size, num_layers, has_biases, *args: Any, out_shape=None, **kwargs: Any) -> int:
            return rnn_layer_flops(input, weight0, weight1, mode=int(mode), has_biases=bool(has_biases))

    if bwd is not None and bwd not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(bwd)
        def _rnn_layer_backward(input, weight1, weight2, weight3, weight4, hx, cx, output, hy, cy,
                                grad_output, grad_hy, grad_cy, reverse, mode, hidden_size, num_layers,
                                has_biases, *args: Any, out_shape=None, **kwargs: Any) -> int:
            # Gradients of the input and hidden state plus of both weights: twice the forward.
            return 2 * rnn_layer_flops(input, weight1, weight2, mode=int(mode), has_biases=bool(has_biases))


_register_rnn_formulas()


# FLOPs per element, by aten overload packet name. The figures count the
# arithmetic a straightforward kernel does; transcendental functions (exp, log,
# erf, tanh, sqrt) count as 1 each.
PER_ELEMENT: dict[str, float] = {
    # Binary and unary arithmetic: one operation per output element.
    **{n: 1.0 for n in (
        "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "neg", "neg_",
        "relu", "relu_", "abs", "maximum", "minimum", "clamp", "clamp_", "clamp_min",
        "clamp_max", "where", "threshold_backward", "sqrt", "sqrt_", "rsqrt", "exp", "exp_",
        "log", "reciprocal", "pow", "pow_", "sign", "eq", "ne", "gt", "lt", "ge", "le",
        "masked_fill", "masked_fill_", "tanh", "sin", "cos", "square", "logical_not",
        "bitwise_not", "ceil", "floor", "round", "trunc", "erf", "leaky_relu", "hardtanh",
        "_foreach_add", "_foreach_add_", "_foreach_sub", "_foreach_sub_", "_foreach_mul",
        "_foreach_mul_", "_foreach_div", "_foreach_div_", "_foreach_sqrt", "_foreach_sqrt_",
        "_foreach_neg", "_foreach_neg_", "_foreach_maximum_", "_foreach_reciprocal_",
    )},
    # a + value * b * c and a + value * b / c, lerp a + w (b - a): 3 operations.
    **{n: 3.0 for n in (
        "addcmul", "addcmul_", "addcdiv", "addcdiv_", "lerp", "lerp_",
        "_foreach_addcmul", "_foreach_addcmul_", "_foreach_addcdiv", "_foreach_addcdiv_",
        "_foreach_lerp", "_foreach_lerp_",
    )},
    # Activations. sigmoid = 1 / (1 + exp(-x)): neg, exp, add, div = 4.
    "sigmoid": 4.0, "sigmoid_": 4.0,
    "sigmoid_backward": 3.0,  # g * y * (1 - y)
    "tanh_backward": 3.0,  # g * (1 - y * y)
    "silu": 5.0, "silu_": 5.0,  # x * sigmoid(x)
    "silu_backward": 8.0,  # g * s * (1 + x * (1 - s)), with s recomputed (4)
    # GELU, exact (erf) form 0.5 * x * (1 + erf(x / sqrt 2)): div, erf, add, mul, mul
    # = 5, counted 8 to cover the tanh form (x + 0.044715 x^3, tanh, ...) as well.
    "gelu": 8.0, "gelu_": 8.0,
    "gelu_backward": 12.0,  # recomputes the cdf (5) and the pdf (exp, 4 mults) plus g * (...)
    # Softmax over the last dim: max (1), subtract (1), exp (1), sum (1), divide (1).
    "_softmax": 5.0, "_log_softmax": 5.0,
    "_softmax_backward_data": 4.0,  # g * y, row sum, subtract, multiply
    "_log_softmax_backward_data": 3.0,  # g - exp(y) * rowsum(g)
    # Normalisation, per element: mean (1), variance (sub, square, add = 3),
    # normalise (sub, mul = 2), affine (mul, add = 2) = 8; per-row terms ignored.
    "native_layer_norm": 8.0, "native_batch_norm": 8.0, "_native_batch_norm_legit": 8.0,
    "_native_batch_norm_legit_no_training": 4.0, "native_group_norm": 8.0,
    "_fused_rms_norm": 6.0,  # square, sum, rsqrt-mul, weight-mul (+ row terms)
    # Normalisation backward: x_hat recompute (2), two row reductions (2 x 2),
    # the three-term combination (4) = 10, counted without weight/bias grads.
    "native_layer_norm_backward": 10.0, "native_batch_norm_backward": 10.0,
    "native_group_norm_backward": 10.0,
    # Dropout: compare a random number with p, then scale (2); backward mask * scale (2).
    "native_dropout": 2.0, "native_dropout_backward": 2.0, "bernoulli_": 1.0,
    # Losses: mse (sub, square, sum = 3), backward 2 * (x - y) * g / n (3).
    "mse_loss": 3.0, "mse_loss_backward": 3.0,
    # Fused optimizers, per parameter element (Adam/AdamW update: about 16 operations).
    "_fused_adam_": 16.0, "_fused_adamw_": 16.0, "_fused_sgd_": 3.0,
    # Scatter-add of gradient rows into the embedding table: 1 add per grad element.
    "embedding_dense_backward": 1.0,
}

# Reductions: per *input* element.
REDUCTION_PER_INPUT: dict[str, float] = {
    "sum": 1.0, "mean": 1.0, "amax": 1.0, "amin": 1.0, "max": 1.0, "min": 1.0,
    "argmax": 1.0, "argmin": 1.0, "prod": 1.0, "any": 1.0, "all": 1.0,
    "linalg_vector_norm": 2.0, "norm": 2.0, "_foreach_norm": 2.0,  # square + add
    "var": 3.0, "std": 3.0, "var_mean": 3.0, "std_mean": 3.0,  # sub, square, add
    "nll_loss_forward": 0.0, "nll_loss2d_forward": 0.0,  # gathers; counted per target below
}

# Losses indexed by target: one operation per target element.
PER_TARGET: frozenset[str] = frozenset({"nll_loss_forward", "nll_loss_backward",
                                         "nll_loss2d_forward", "nll_loss2d_backward"})

# Ops the schema does not mark as views but that never touch memory.
METADATA_OPS: frozenset[str] = frozenset({
    "_unsafe_view", "lift_fresh", "detach", "detach_", "_reshape_alias", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
    "resize_", "set_", "empty", "empty_like", "empty_strided", "_local_scalar_dense", "alias",
    "new_empty", "new_empty_strided",
})

# Ops that write their output without reading any tensor argument (factories, fills).
WRITE_ONLY_OPS: frozenset[str] = frozenset({
    "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "new_zeros", "new_ones",
    "new_full", "zeros", "ones", "full", "fill_", "zero_", "normal_", "uniform_", "arange",
    "scalar_tensor",
})

# Matmuls with an added input (bias): the registry counts the products only; the
# add costs one FLOP per output element (REFERENCE.md: "plus N_out for the bias").
# The same holds for aten.convolution with a bias.
BIAS_ADD_OPS: frozenset[str] = frozenset({"addmm", "baddbmm", "addbmm", "addmv"})


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """What one op call costs at minimum: FLOPs and bytes (both exact integers)."""

    flops: int
    bytes: int


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or outputs (tuples, lists, dicts), in order. Not pytree's
    ``tree_flatten``: it cost ~20 us per call, half the counter's Python on a deep step."""
    found: list[torch.Tensor] = []
    _collect(value, found)
    return found


def _collect(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, found)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements of ``t``: a zero-stride (broadcast) dim counts once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= int(size)
    if t.numel() == 0:
        n = 0
    return n * t.element_size()


def _largest_numel(tensors: list[torch.Tensor]) -> int:
    return max((t.numel() for t in tensors), default=0)


def _flop_formula(func: torch._ops.OpOverload) -> Callable[..., int] | None:
    return flop_counter.flop_registry.get(func.overloadpacket)


def op_flops(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one call (sources: ``flop_registry`` and ``PER_ELEMENT``), in FLOPs."""
    formula = _flop_formula(func)
    name = func.overloadpacket.__name__
    if formula is not None:
        flops = int(formula(*args, **kwargs, out_val=out))
        if name in BIAS_ADD_OPS and kwargs.get("beta", 1) != 0:
            flops += _largest_numel(_tensors(out))
        elif name == "convolution" and len(args) > 2 and isinstance(args[2], torch.Tensor):
            flops += _largest_numel(_tensors(out))  # the bias add, which the registry leaves out
        return flops
    if name in PER_TARGET:
        target = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
        return int(target.numel()) if target is not None else 0
    if name in REDUCTION_PER_INPUT:
        if name.startswith("_foreach"):  # a reduction of each tensor of the list
            return int(REDUCTION_PER_INPUT[name] * sum(t.numel() for t in _tensors(args[0])))
        ins = _tensors((args, kwargs))
        return int(REDUCTION_PER_INPUT[name] * sum(t.numel() for t in ins[:1] or ins))
    per = PER_ELEMENT.get(name)
    if per is None:
        per = 1.0 if _schema_of(func).pointwise else 0.0
    if per == 0.0:
        return 0
    outs = _tensors(out)
    if name.startswith("_foreach") or name.startswith("_fused"):
        # List ops: the first tensor list is the one updated (or produced).
        first = next((a for a in args if isinstance(a, (list, tuple))), None)
        return int(per * sum(t.numel() for t in _tensors(first)))
    if name in ("native_layer_norm", "native_group_norm", "native_batch_norm",
                "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                "native_dropout", "_fused_rms_norm"):
        outs = outs[:1]  # the normalised output, not the saved statistics or mask
    elif name in ("native_layer_norm_backward", "native_batch_norm_backward",
                  "native_group_norm_backward"):
        outs = [args[0]] if isinstance(args[0], torch.Tensor) else outs
    elif not outs:  # an in-place op returning its target
        outs = _tensors(args)[:1]
    return int(per * _largest_numel(outs))


class _Schema:
    """What ``op_bytes`` and ``op_flops`` read from an overload's schema, read once per overload
    (``_schema_of``): walking the schema on every call was a fifth of the counter's Python."""

    __slots__ = ("alias_only", "written", "pointwise")

    def __init__(self, func: torch._ops.OpOverload) -> None:
        schema = func._schema
        writes = [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments]
        # Views and aliases: every return aliases an input and nothing is written.
        self.alias_only = bool(schema.returns) and not any(writes) and all(
            r.alias_info is not None for r in schema.returns)
        # (position, name, keyword-only, is an out= buffer) of each argument the op writes
        self.written = tuple((i, a.name, a.kwarg_only, a.is_out)
                             for i, (a, w) in enumerate(zip(schema.arguments, writes)) if w)
        self.pointwise = torch.Tag.pointwise in func.tags


_SCHEMAS: dict[Any, _Schema] = {}


def _schema_of(func: torch._ops.OpOverload) -> _Schema:
    found = _SCHEMAS.get(func)
    if found is None:
        found = _SCHEMAS[func] = _Schema(func)
    return found


def _is_alias_only(func: torch._ops.OpOverload) -> bool:
    """True for views and aliases: every return aliases an input and nothing is written."""
    return _schema_of(func).alias_only


def _picked_input(name: str, args: tuple) -> tuple[Any, int]:
    """(the input an op reads only in part, the bytes it reads of it): the negative log-likelihood
    reads one log-probability per target of its [N, C] input (forward) and only the input's shape
    (backward, which writes its whole gradient). Charged whole, nanoGPT's loss read 122x its roof."""
    if name in PER_TARGET and len(args) >= 3 and isinstance(args[0], torch.Tensor):
        self_arg, target = (args[0], args[1]) if name.endswith("_forward") else (args[1], args[2])
        if isinstance(self_arg, torch.Tensor) and isinstance(target, torch.Tensor):
            read = target.numel() * self_arg.element_size() if name.endswith("_forward") else 0
            return self_arg, read
    return None, 0


def op_bytes(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any,
             inputs: list[torch.Tensor] | None = None) -> int:
    """Minimum bytes one call moves (tensor sizes from ``Tensor.element_size``), in bytes.
    ``inputs``: ``tensor_args(args, kwargs)`` when the caller has it already."""
    name = func.overloadpacket.__name__
    schema = _schema_of(func)
    if name in METADATA_OPS or schema.alias_only:
        return 0
    written_args: list[torch.Tensor] = []
    out_args: set[int] = set()
    for i, arg_name, kwarg_only, is_out in schema.written:
        value = kwargs.get(arg_name) if kwarg_only or i >= len(args) else args[i]
        ts = _tensors(value)
        written_args.extend(ts)
        if is_out:
            out_args.update(id(t) for t in ts)
    total = 0
    seen: set[int] = set()
    read = [] if name in WRITE_ONLY_OPS else (_tensors((args, kwargs)) if inputs is None else inputs)
    picked = _picked_input(name, args)
    for t in read:
        if id(t) in seen or id(t) in out_args:
            continue  # read each input once; an out= buffer is only written
        seen.add(id(t))
        total += tensor_bytes(t) if t is not picked[0] else picked[1]
    written_ids = {id(t) for t in written_args}
    for t in written_args:
        total += tensor_bytes(t)
    for t in _tensors(out):
        if id(t) not in written_ids and id(t) not in seen:
            total += tensor_bytes(t)
    return total


def op_cost(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any,
            inputs: list[torch.Tensor] | None = None) -> OpCost:
    """FLOPs and minimum bytes of one call."""
    return OpCost(flops=op_flops(func, args, kwargs, out), bytes=op_bytes(func, args, kwargs, out, inputs))


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def op_dtype(args: tuple, kwargs: dict, out: Any, inputs: list[torch.Tensor] | None = None) -> str:
    """The dtype an op computes in: its first floating input, else its first tensor."""
    ins = _tensors((args, kwargs)) if inputs is None else inputs
    for t in ins:
        if t.is_floating_point():
            return dtype_name(t.dtype)
    ts = ins or _tensors(out)
    return dtype_name(ts[0].dtype) if ts else ""


def input_shapes(args: tuple, kwargs: dict, inputs: list[torch.Tensor] | None = None) -> list[list[int]]:
    """Shapes of the tensor arguments, in order."""
    return [list(map(int, t.shape)) for t in (_tensors((args, kwargs)) if inputs is None else inputs)]


def tensor_args(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among an op's arguments, in order (``inputs`` of the functions above)."""
    return _tensors((args, kwargs))


def intensity(flops: int, nbytes: int) -> float | None:
    """FLOPs per byte; None when the op moves no bytes."""
    return flops / nbytes if nbytes > 0 else None


__all__ = ["OpCost", "op_cost", "op_flops", "op_bytes", "op_dtype", "input_shapes", "tensor_args",
           "tensor_bytes", "dtype_name", "intensity", "PER_ELEMENT", "REDUCTION_PER_INPUT"]
