"""How many nonzero values a fit's fake tensor holds, where the ops that made it say so: an op whose
output shape depends on values (``nonzero``, ``torch.where(mask)``, ``x[mask]``, ``masked_select``)
then gets a shape, and a read of a count (``mask.sum(0).tolist()``) a value.

A mixture-of-experts router builds its dispatch mask from ``topk``: ``zeros(...).scatter(1,
top_k_indices, gates)`` or ``one_hot(top_k_indices, n_experts)``. Such a mask holds exactly tokens
x k nonzero values whatever the routing, and every expert's batch is cut from it. ``Sparsity``
follows that count from op to op:

- zeros hold none; a scatter onto a counted tensor adds its index's elements (at most its size);
- an op that keeps each element's zero a zero and its place (a view, a copy, a cast, ``x > 0``,
  ``x != 0``, ``relu``, ``abs``) keeps the count, in proportion to its elements: a part (``select``,
  ``slice``, ``unbind``) holds its share, the balanced routing; a product holds the least of its
  counted factors';
- a sum over a tensor of zeros and ones (a mask) has the count as its total (``(gates > 0).sum(0)``:
  the tokens of every expert), and a read of it (``tolist``, ``item``) gives that total, split evenly.

The shape is exact where the count is (what a top-k router sends: every token to k experts) and an
estimate where a share is (each expert's tokens, as if routing were balanced): the fit's report
lists each such op by line (``run.estimated_shapes``). An op on a tensor not counted still stops
the fit there, naming its line (``advisor.fit.reads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from advisor.fit.reads import script_frame

aten = torch.ops.aten


@dataclass(frozen=True)
class Count:
    nonzero: int  # how many of the tensor's elements are not zero
    binary: bool = False  # every element is 0 or 1 (a mask)
    total: int | None = None  # the sum of its elements, where known (a sum of a mask)
    distinct: bool = False  # a 1-D tensor of values that differ from each other (an arange)


def _packets(*names: str) -> frozenset[Any]:
    return frozenset(getattr(aten, name) for name in names if hasattr(aten, name))


_ZEROS = _packets("zeros", "zeros_like", "new_zeros", "zero_", "zero")
_FILLS = _packets("full", "full_like", "new_full", "fill_", "fill")  # zeros when the value is 0
_SCATTERS = _packets("scatter", "scatter_", "scatter_add", "scatter_add_")
_ASSIGNS = _packets("scatter", "scatter_")  # the scatters that write values, not add them
# Each output element is a function of one input element that maps 0 to 0 and keeps 0/1 masks.
_KEEPS_MASK = _packets(
    "view", "_unsafe_view", "reshape", "_reshape_alias", "permute", "transpose", "t", "unsqueeze", "squeeze",
    "flatten", "clone", "_to_copy", "to", "detach", "alias", "contiguous", "lift_fresh", "lift_fresh_copy",
    "slice", "narrow", "split", "split_with_sizes", "chunk", "expand", "abs", "relu",
    "movedim", "swapaxes", "unflatten", "view_as", "expand_as", "index_select", "squeeze_copy", "view_copy")
_PARTS = _packets("select", "unbind")  # one index of a dimension: an even share of the count
_KEEPS_ZEROS = _packets("neg", "sign", "sqrt", "square", "sin", "tanh")
_NONZERO_TESTS = _packets("gt", "ne", "greater", "not_equal")  # x > 0, x != 0: a mask with x's count
_PRODUCTS = _packets("mul", "mul_", "logical_and", "bitwise_and", "__and__")
_SUMS = _packets("sum", "count_nonzero")
_EQUALS = _packets("eq")  # one_hot on fake tensors: ``arange(n) == x.unsqueeze(-1)``
_RANGES = _packets("arange")
_SIZED = _packets("nonzero", "argwhere", "masked_select")


class Sparsity:
    """The counts of a fit's fake tensors (``after`` each op), and the shapes they give (``shaped``)."""

    def __init__(self) -> None:
        self._counts: Any = WeakIdKeyDictionary()
        self.sized: dict[tuple[str, int, str, str], list[int]] = {}  # (file, line, code, op) -> [calls, rows]

    def count(self, tensor: Any) -> Count | None:
        return self._counts.get(tensor) if isinstance(tensor, torch.Tensor) else None

    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Record the count of ``out``, where the op and its inputs' counts say it."""
        packet = getattr(func, "overloadpacket", None)
        rule = _RULES.get(packet)
        if rule is None and not self._counts:
            return
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if rule is None or not args:  # an op this module cannot follow: an in-place one forgets
            for tensor in outputs:
                self._counts.pop(tensor, None)
            return
        for position, tensor in enumerate(outputs):
            found = rule(self, packet, args, kwargs, tensor, position)
            if found is not None:
                self._counts[tensor] = found
            elif tensor in self._counts:  # an in-place op this module cannot follow
                del self._counts[tensor]

    def shaped(self, func: Any, args: tuple[Any, ...]) -> tuple[tuple[int, ...], torch.dtype] | None:
        """The output shape and dtype of a value-shaped op on a counted tensor, or None."""
        packet = getattr(func, "overloadpacket", None)
        if packet not in _SIZED or not args:
            return None
        if packet is aten.masked_select:
            found = self.count(args[1]) if len(args) > 1 else None
            if found is None or tuple(args[0].shape) != tuple(args[1].shape):
                return None
            shape, dtype = (found.nonzero,), args[0].dtype
        else:
            found = self.count(args[0])
            if found is None:
                return None
            shape, dtype = (found.nonzero, args[0].dim()), torch.int64
        self._log(str(packet), found.nonzero)
        return shape, dtype

    def _log(self, op: str, rows: int) -> None:
        where = script_frame() or {}
        key = (where.get("file", "?"), where.get("line", 0), where.get("code", ""), op)
        calls = self.sized.setdefault(key, [0, 0])
        calls[0] += 1
        calls[1] += rows

    def values(self, tensor: Any) -> list[int] | None:
        """The values a read of ``tensor`` gets when its total is known (a sum of a mask): the total
        split evenly over its elements, the first ones taking the remainder; None otherwise."""
        found = self.count(tensor)
        if found is None or found.total is None or tensor.dtype.is_floating_point:
            return None
        size = tensor.numel()
        self._log("read", found.total)
        if size == 0:
            return []
        share, left = divmod(found.total, size)
        return [share + (1 if i < left else 0) for i in range(size)]


def _share(found: Count, source: torch.Tensor, out: torch.Tensor) -> int:
    """``found``'s count in proportion to ``out``'s elements (a part's share, an expansion's whole)."""
    size = source.numel()
    if size == 0:
        return 0
    return min(out.numel(), round(found.nonzero * out.numel() / size))


def _zeros(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    if packet in _FILLS:  # full(size, v), full_like(x, v), new_full(x, size, v), fill_(x, v)
        value = args[-1] if len(args) > 1 else kwargs.get("fill_value", kwargs.get("value"))
        if isinstance(value, torch.Tensor) or value != 0:
            return None
    return Count(0, binary=True, total=0)


def _scatter(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    base = sparsity.count(args[0])
    index = args[2] if len(args) > 2 else kwargs.get("index")
    if base is None or not isinstance(index, torch.Tensor):
        return None
    value = args[3] if len(args) > 3 else kwargs.get("value", kwargs.get("src"))
    binary = base.binary and packet in _ASSIGNS and not isinstance(value, torch.Tensor) and value in (0, 1)
    return Count(min(out.numel(), base.nonzero + index.numel()), binary=binary)


def _keeps(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    found = sparsity.count(args[0])
    if found is None:
        return None
    return Count(_share(found, args[0], out), binary=found.binary and packet in _KEEPS_MASK)


def _part(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
          position: int) -> Count | None:
    """``mask[e]`` (``select``) or ``mask.unbind(0)[e]``: the count spread evenly over the dimension,
    the first indices taking the remainder, so that the parts add up to the whole (each expert's
    tokens, routing balanced)."""
    found = sparsity.count(args[0])
    if found is None:
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    size = args[0].shape[dim] if args[0].dim() else 1
    index = position if packet is aten.unbind else (args[2] if len(args) > 2 else kwargs.get("index", 0))
    if size == 0 or not isinstance(index, int):
        return None
    share, left = divmod(found.nonzero, size)
    return Count(min(out.numel(), share + (1 if index % size < left else 0)), binary=found.binary)


def _nonzero_test(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    other = args[1] if len(args) > 1 else kwargs.get("other")
    found = sparsity.count(args[0])
    if found is None or isinstance(other, torch.Tensor) or other != 0:
        return None
    return Count(_share(found, args[0], out), binary=True)


def _product(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    counted = [(sparsity.count(a), a) for a in args[:2] if isinstance(a, torch.Tensor)]
    shares = [_share(found, a, out) for found, a in counted if found is not None]
    if not shares:
        return None
    binary = all(found is not None and found.binary or a.dtype == torch.bool for found, a in counted)
    return Count(min(shares), binary=binary)


def _sum(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    found = sparsity.count(args[0])
    if found is None:
        return None
    mask = found.binary or args[0].dtype == torch.bool or packet is aten.count_nonzero
    return Count(min(out.numel(), found.nonzero), total=found.nonzero if mask else None)


def _arange(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    start = args[0] if len(args) > 1 else kwargs.get("start", 0)
    return Count(out.numel() - (1 if start == 0 and out.numel() else 0), distinct=out.dim() == 1)


def _equal(sparsity: Sparsity, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
        position: int) -> Count | None:
    """``x.unsqueeze(-1) == arange(n)``: each element of x equals at most one of n distinct values
    (exactly one for an index below n, as ``one_hot`` requires)."""
    if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
        return None
    for values, other in ((args[0], args[1]), (args[1], args[0])):
        found = sparsity.count(values)
        if found is not None and found.distinct and other.dim() >= 1 and other.shape[-1] == 1:
            return Count(min(out.numel(), other.numel()), binary=True)
    return None


_Rule = Callable[[Sparsity, Any, tuple[Any, ...], dict[str, Any], torch.Tensor, int], "Count | None"]
_RULES: dict[Any, _Rule] = {
    **{p: _zeros for p in _ZEROS | _FILLS},
    **{p: _scatter for p in _SCATTERS},
    **{p: _keeps for p in _KEEPS_MASK | _KEEPS_ZEROS},
    **{p: _part for p in _PARTS},
    **{p: _nonzero_test for p in _NONZERO_TESTS},
    **{p: _product for p in _PRODUCTS},
    **{p: _sum for p in _SUMS},
    **{p: _arange for p in _RANGES},
    **{p: _equal for p in _EQUALS},
}
