"""The content of one checkpoint file: a structure that ``torch.load(weights_only=True)``
can read back.

weights_only refuses anything but tensors and plain Python values (a checkpoint is data,
and a tampered archive must not run code), so numpy arrays and scalars are stored as
tensors and their positions recorded (in the manifest) to turn them back on load.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# Exact types only: subclasses (IntEnum, np.float64 which subclasses float) would pickle
# as their own class, which weights_only=True refuses to load.
_SCALARS = (type(None), bool, int, float, complex, str, bytes)

LeafPath = tuple  # a leaf's position: dict keys (str | int) and list/tuple indices


@dataclass
class Encoded:
    """One file's structure ready for ``torch.save``, and where its numpy leaves were."""

    obj: Any
    numpy: list[LeafPath] = field(default_factory=list)
    numpy_scalars: list[LeafPath] = field(default_factory=list)


def encode(obj: Any, key: str) -> Encoded:
    """Copy the structure of file ``key`` with numpy leaves as tensors.

    dict/list/tuple subclasses become plain dict/list/tuple (weights_only cannot load
    arbitrary classes); anything else unsupported is a ValueError naming the leaf.
    Tensors and arrays share memory with ``obj``, so this is cheap to do up front.
    """
    out = Encoded(None)
    out.obj = _encode(obj, (key,), out)
    return out


def decode(obj: Any, numpy: set[LeafPath], numpy_scalars: set[LeafPath]) -> Any:
    """Inverse of :func:`encode`: tensors at the recorded positions become numpy again.
    A recorded position that is missing or not a tensor is a ValueError naming it."""
    found: set[LeafPath] = set()
    out = _decode(obj, (), numpy, numpy_scalars, found)
    lost = (numpy | numpy_scalars) - found
    if lost:
        raise ValueError(f"numpy leaf {list(min(lost, key=str))} not found")
    return out


def _fmt(path: LeafPath) -> str:
    key, *rest = path
    return key + "".join(f"[{k!r}]" for k in rest)


def _encode(obj: Any, path: LeafPath, out: Encoded) -> Any:
    if isinstance(obj, torch.Tensor):
        return _compact(obj)
    if isinstance(obj, np.ndarray):
        out.numpy.append(path[1:])
        return _array_to_tensor(obj, path)
    if isinstance(obj, np.generic):
        out.numpy_scalars.append(path[1:])
        return _array_to_tensor(np.asarray(obj), path)
    if type(obj) in _SCALARS:
        return obj
    if isinstance(obj, dict):
        items = {}
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise ValueError(f"{_fmt(path)}: dict key {k!r} must be str or int")
            items[k] = _encode(v, (*path, k), out)
        return items
    if isinstance(obj, (list, tuple)):
        seq = [_encode(v, (*path, i), out) for i, v in enumerate(obj)]
        return seq if isinstance(obj, list) else tuple(seq)
    raise ValueError(
        f"{_fmt(path)}: unsupported value of type {type(obj).__name__} "
        "(use tensors, numpy, dict/list/tuple, int/float/bool/complex/str/bytes/None)"
    )


def _array_to_tensor(arr: np.ndarray, path: LeafPath) -> torch.Tensor:
    if arr.dtype.kind not in "biufc":
        raise ValueError(f"{_fmt(path)}: numpy dtype {arr.dtype} cannot be stored as a tensor")
    if not arr.dtype.isnative:  # torch has no big-endian tensors: comes back native-endian
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    try:
        with warnings.catch_warnings():  # read-only (an object-store array): shared, never written
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(arr)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"{_fmt(path)}: numpy dtype {arr.dtype} has no torch equivalent ({e})") from e


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A view of a bigger tensor is copied: torch.save writes the whole storage."""
    if t.layout is not torch.strided or t.device.type == "meta":
        return t
    if t.untyped_storage().nbytes() <= t.numel() * t.element_size():
        return t
    return t.detach().clone().requires_grad_(t.requires_grad)


def _decode(obj: Any, path: LeafPath, arrays: set, scalars: set, found: set) -> Any:
    if path in arrays or path in scalars:
        if not isinstance(obj, torch.Tensor):
            raise ValueError(f"numpy leaf {list(path)} is not a tensor")
        found.add(path)
        a = obj.detach().numpy()
        return a[()] if path in scalars else a
    if isinstance(obj, dict):
        return {k: _decode(v, (*path, k), arrays, scalars, found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_decode(v, (*path, i), arrays, scalars, found) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj
