"""Pack numpy arrays into ``NDArray`` messages and unpack them with validation.

Arrays travel as explicit dtype + shape + little-endian C-order bytes, never as repeated
scalars. Decoding is zero-copy (``numpy.frombuffer``) and checks everything a sender can get
wrong, raising :class:`WireError` that names the field.
"""

from __future__ import annotations

import math

import numpy as np

from moeplane.controlplane.wire import moeplane_pb2 as pb

ALLOWED_DTYPES = ("int32", "int64", "uint8", "uint16", "float32", "float64")
_WIRE_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}  # by wire name
MAX_ITEMS = 1 << 24  # 16M items: far above 58 x 256 x 1024, far below a memory blow-up


class WireError(ValueError):
    """A message field that is malformed or inconsistent. ``field`` names it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def encode_array(array: np.ndarray) -> pb.NDArray:
    """Pack ``array`` (any shape, one of ALLOWED_DTYPES) as little-endian C-order bytes."""
    arr = np.asarray(array)
    name = arr.dtype.name
    if name not in ALLOWED_DTYPES:
        raise WireError("dtype", f"{name!r} is not one of {', '.join(ALLOWED_DTYPES)}")
    le = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return pb.NDArray(dtype=name, shape=list(arr.shape), data=le.tobytes())


def decode_array(
    msg: pb.NDArray,
    field: str,
    *,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    kinds: str = "if",
    nonnegative: bool = False,
    finite: bool = True,
) -> np.ndarray:
    """Unpack and validate an ``NDArray``; read-only view of the message bytes.

    Args:
        msg: the message.
        field: name used in errors, e.g. ``"loads.counts"``.
        ndim: required number of dimensions.
        shape: required shape; ``None`` entries are free.
        kinds: allowed numpy dtype kinds (``"i"`` signed integer, ``"u"`` unsigned integer,
            ``"f"`` float); ``"iu"`` where any integer dtype is accepted (e.g. plan arrays).
        nonnegative: reject negative values.
        finite: reject NaN and infinities (floats only).
    """
    dtype = _WIRE_DTYPES.get(msg.dtype)
    if dtype is None:
        raise WireError(f"{field}.dtype", f"{msg.dtype!r} is not one of {', '.join(ALLOWED_DTYPES)}")
    if dtype.kind not in kinds:
        raise WireError(f"{field}.dtype", f"{msg.dtype} not allowed here (want kind {kinds!r})")
    dims = tuple(msg.shape)
    if dims and min(dims) < 0:
        raise WireError(f"{field}.shape", f"negative dimension in {dims}")
    items = math.prod(dims)
    if items > MAX_ITEMS:
        raise WireError(f"{field}.shape", f"{items} items exceeds the limit of {MAX_ITEMS}")
    if ndim is not None and len(dims) != ndim:
        raise WireError(f"{field}.shape", f"expected {ndim} dimensions, got {len(dims)}")
    if shape is not None and dims != shape:  # (None entries are free: compare one by one)
        for i, (got, want) in enumerate(zip(dims, shape, strict=False)):
            if want is not None and got != want:
                raise WireError(f"{field}.shape", f"dimension {i} is {got}, expected {want}")
    if len(msg.data) != items * dtype.itemsize:
        raise WireError(
            f"{field}.data",
            f"{len(msg.data)} bytes do not match shape {dims} of {msg.dtype} "
            f"({items * dtype.itemsize} bytes)",
        )
    arr = np.frombuffer(msg.data, dtype=dtype).reshape(dims)
    if dtype.kind == "f" and finite and not np.isfinite(arr).all():
        raise WireError(field, "contains NaN or infinity")
    if nonnegative and arr.size and arr.min() < 0:
        raise WireError(field, "contains negative values")
    return arr
