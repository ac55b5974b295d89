"""A rank's RNG states (torch, CUDA, numpy, python) as plain JSON data, and back.

A snapshot keeps them in ``rank-<r>.json``: data only (numbers, and the generators' bytes in base64), so loading it
runs no code, and it loads in tens of microseconds where a ``torch.load(weights_only=True)`` of the same states took
about 0.3 ms. :func:`decode` also reads the forms older snapshots kept in ``rank-<r>.pt`` (tensors; scalars as numbers
or 0-d tensors).
"""
from __future__ import annotations

import base64
import binascii
import functools
import math
import random
import struct
from typing import Any, Dict, Optional

from ..errors import SnapshotError

#: The sizes of the generators' states: numpy's MT19937 keys, python's Mersenne Twister (624 words and its index).
NUMPY_WORDS = 624
PYTHON_WORDS = 625


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _bytes(value: Any, what: str) -> bytes:
    """The raw bytes of ``value``: a base64 string (this form) or a tensor (older snapshots)."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise SnapshotError(f"{what} is not base64 ({exc})") from None
    if hasattr(value, "numpy"):  # a tensor of an older snapshot
        return value.detach().cpu().contiguous().numpy().tobytes()
    raise SnapshotError(f"{what} is a {type(value).__name__}, not the bytes of a generator state")


def _words(value: Any, what: str) -> tuple:
    """A tuple of ints: little-endian uint32 words in base64 (this form), or an int64 tensor (older snapshots)."""
    if isinstance(value, str):
        raw = _bytes(value, what)
        if len(raw) % 4:
            raise SnapshotError(f"{what} holds {len(raw)} bytes, not whole 32-bit words")
        return struct.unpack(f"<{len(raw) // 4}I", raw)
    if hasattr(value, "tolist"):
        return tuple(int(v) for v in value.tolist())
    raise SnapshotError(f"{what} is a {type(value).__name__}, not a generator's words")


def _number(value: Any) -> float:
    return float(value.item() if hasattr(value, "item") else value)


def encode() -> Dict[str, Any]:
    """This process's RNG states now, as JSON-able data."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    state: Dict[str, Any] = {"torch": _b64(torch.get_rng_state().numpy().tobytes())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = _b64(torch.cuda.get_rng_state().numpy().tobytes())
    try:
        import numpy as np  # numpy: optional or heavy, loaded on first use

        _, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = {"keys": _b64(keys.astype("<u4").tobytes()), "pos": int(pos), "has_gauss": int(has_gauss),
                          "gauss": float(gauss)}
    except ImportError:
        pass
    version, internal, gauss = random.getstate()
    state["python"] = {"version": int(version), "internal": _b64(struct.pack(f"<{len(internal)}I", *internal)),
                       "gauss": gauss}
    return state


def decode(state: Any, what: str = "the RNG state") -> Dict[str, Any]:
    """``state`` (this form or an older one) made ready for :func:`apply`, checked: a damaged or edited state raises
    here, before anything is loaded.

    Raises:
        SnapshotError: a part is missing, or not the size of this process's generator state.
    """
    try:
        ready: Dict[str, Any] = {"torch": _bytes(state["torch"], f"{what} (torch)")}
        _expect(len(ready["torch"]), _torch_state_bytes(), f"{what} (torch)", "bytes")
        if "cuda" in state:
            ready["cuda"] = _bytes(state["cuda"], f"{what} (cuda)")
        if "numpy" in state:
            ready["numpy"] = _numpy(state["numpy"], f"{what} (numpy)")
        p = state["python"]
        words = _words(p["internal"], f"{what} (python)")
        _expect(len(words), PYTHON_WORDS, f"{what} (python)", "words")
        gauss: Optional[float] = None if p["gauss"] is None else _number(p["gauss"])
        ready["python"] = (int(_number(p["version"])), words, None if gauss is None or math.isnan(gauss) else gauss)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SnapshotError(f"{what} is damaged or edited ({type(exc).__name__}: {exc}); nothing was loaded") from None
    return ready


@functools.lru_cache(maxsize=1)
def _torch_state_bytes() -> int:
    import torch  # torch: loaded on first use, not on import raytrain_nb

    return int(torch.get_rng_state().numel())


def _expect(got: int, want: int, what: str, unit: str) -> None:
    if got != want:
        raise SnapshotError(f"{what} holds {got} {unit}, not the {want} of a generator here; nothing was loaded")


def _numpy(n: Dict[str, Any], what: str) -> Optional[tuple]:
    """numpy's ``set_state`` tuple; None where numpy is not installed (no generator to set)."""
    try:
        import numpy as np  # numpy: optional or heavy, loaded on first use
    except ImportError:
        return None
    if isinstance(n["keys"], str):
        raw = _bytes(n["keys"], what)
        keys = np.frombuffer(raw[: len(raw) - len(raw) % 4], dtype="<u4").astype(np.uint32)
    else:  # a tensor of an older snapshot
        keys = np.asarray(_words(n["keys"], what), dtype=np.uint32)
    _expect(len(keys), NUMPY_WORDS, what, "words")
    return ("MT19937", keys, int(_number(n["pos"])), int(_number(n["has_gauss"])), _number(n["gauss"]))


def apply(ready: Dict[str, Any]) -> None:
    """Set this process's generators to a :func:`decode`-d state."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    torch.set_rng_state(torch.frombuffer(bytearray(ready["torch"]), dtype=torch.uint8))
    if "cuda" in ready and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(ready["cuda"]), dtype=torch.uint8))
    if ready.get("numpy") is not None:
        import numpy as np  # numpy: optional or heavy, loaded on first use

        np.random.set_state(ready["numpy"])
    random.setstate(ready["python"])
