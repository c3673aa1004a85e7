"""Checkpoint files that can be read without running code: tensors in safetensors, the rest JSON.

``save_tree`` / ``load_tree`` round-trip a nested structure exactly in one ``.safetensors``
file: each tensor or NumPy array is a tensor named by its path in the structure
(``state_dict/layer1.0.conv1.weight``), everything else a JSON tree in the header under
``HEADER_KEY``; writes are atomic. ``load_state_dict`` reads foreign weights from safetensors
or a torch pickle with ``weights_only=True``; one that needs more is an ``UnsafeCheckpointError``.

Design: docs/data_models_runs.md, "Checkpoint files".
"""

from __future__ import annotations

import errno
import json
import re
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from endoexplain_core import files

HEADER_KEY = "endoexplain"
SUFFIX = ".safetensors"
# NumPy dtypes torch cannot hold exactly are stored widened and narrowed back on load.
_WIDENED = {"uint16": torch.int32, "uint32": torch.int64}


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, malformed or of the wrong kind (names the file)."""


class UnsafeCheckpointError(CheckpointError):
    """A weights file would need to run code (unpickle arbitrary objects) to be read: refused."""


# ----------------------------------------------------------------------------- encoding


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able skeleton of ``value``; tensors and arrays move to ``tensors`` under ``path``."""
    if isinstance(value, torch.Tensor):
        return {"__tensor__": _store(path, value.detach().cpu().contiguous().clone(), tensors)}
    if isinstance(value, np.ndarray):
        dtype = str(value.dtype)
        array = np.ascontiguousarray(value)
        tensor = (torch.from_numpy(array.astype(np.int64)).to(_WIDENED[dtype]) if dtype in _WIDENED
                  else torch.from_numpy(array.copy()))
        return {"__ndarray__": _store(path, tensor, tensors), "dtype": dtype}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{path}/{k}" if path else k, tensors) for k, v in value.items()}
        return {"__items__": [[_encode(k, f"{path}/key{i}", tensors),
                               _encode(v, f"{path}/{k}" if path else str(k), tensors)]
                              for i, (k, v) in enumerate(value.items())]}
    raise TypeError(f"cannot store a {type(value).__name__} at {path or '<root>'} in a checkpoint "
                    f"(only tensors, arrays, numbers, strings, None, lists, tuples and dicts)")


def _store(path: str, tensor: torch.Tensor, tensors: dict[str, torch.Tensor]) -> str:
    name = path or "<root>"
    if name in tensors:
        raise ValueError(f"two tensors would be stored under the same name {name!r}")
    tensors[name] = tensor
    return name


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__ndarray__" in value:
        return tensors[value["__ndarray__"]].numpy().astype(value["dtype"])
    if "__tuple__" in value:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    if "__items__" in value:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__items__"]}
    return {k: _decode(v, tensors) for k, v in value.items()}


# ----------------------------------------------------------------------------- files


def save_tree(tree: dict[str, Any], path: str | Path) -> Path:
    """Write a nested structure of tensors/arrays and plain values to ``path`` atomically.

    Returns ``path``. On any failure (e.g. ``OSError`` for a full disk) the temporary file is
    removed, the previous ``path`` (if any) is left untouched and the error names ``path``.
    """
    tensors: dict[str, torch.Tensor] = {}
    skeleton = json.dumps(_encode(tree, "", tensors), sort_keys=False)

    def write(temporary: Path) -> None:
        try:
            save_file(tensors, temporary, metadata={HEADER_KEY: skeleton})
        except SafetensorError as error:  # safetensors reports I/O errors as its own type
            raise OSError(_errno_of(error), str(error)) from error

    return files.replace_atomically(path, write)


def _errno_of(error: BaseException) -> int:
    """The OS error number inside a safetensors message ("... (os error 28)"), else EIO."""
    found = re.search(r"os error (\d+)", str(error))
    return int(found.group(1)) if found else errno.EIO


def load_tree(path: str | Path) -> dict[str, Any]:
    """Read a file written by ``save_tree`` (tensors on the CPU). Never unpickles anything.

    Raises ``FileNotFoundError`` for a missing file and ``CheckpointError`` naming the file
    when it is truncated, not safetensors, or not written by this package.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    tensors, metadata = _read_safetensors(path)
    if HEADER_KEY not in metadata:
        raise CheckpointError(f"{path}: a safetensors file, but not an endoExplain checkpoint "
                              f"(no '{HEADER_KEY}' header)")
    try:
        skeleton = json.loads(metadata[HEADER_KEY])
        tree = _decode(skeleton, tensors)
    except (ValueError, RecursionError) as error:   # JSONDecodeError is a ValueError
        raise CheckpointError(f"{path}: damaged checkpoint header ({type(error).__name__}: "
                              f"{_first_line(error)[:120]})") from error
    except (KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path}: the checkpoint header does not describe its tensors "
                              f"({type(error).__name__}: {_first_line(error)[:120]})") from error
    if not isinstance(tree, dict):
        raise CheckpointError(f"{path}: the checkpoint header holds a {type(tree).__name__}, not a record")
    return tree


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, header metadata) of a safetensors file; ``CheckpointError`` when unreadable."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        size = path.stat().st_size
        raise CheckpointError(f"{path}: not a readable safetensors file ({size} bytes; truncated "
                              f"or damaged?): {_first_line(error)}") from error
    return tensors, metadata


# ----------------------------------------------------------------------------- foreign weights


# Declared uncompressed size of a torch zip archive (docs/data_models_runs.md, "Checkpoint files").
MAX_ARCHIVE_BYTES = 512 * 1024 ** 2


def check_declared_size(path: Path, head: bytes) -> None:
    """Refuse a torch zip archive whose members declare more than ``MAX_ARCHIVE_BYTES``
    uncompressed (a zip bomb would fill memory before any check could see its tensors)."""
    if head[:2] != b"PK":
        return
    try:
        with zipfile.ZipFile(path) as archive:
            declared = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(f"{path}: cannot read the weights archive (truncated or damaged?): "
                              f"{_first_line(error)}") from error
    if declared > MAX_ARCHIVE_BYTES:
        raise CheckpointError(f"{path}: the archive declares {declared / 1024 ** 2:,.0f} MiB "
                              f"uncompressed, above the {MAX_ARCHIVE_BYTES / 1024 ** 2:,.0f} MiB limit "
                              f"for classifier weights; not loaded")


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A model state dict from a weights file, read without running code.

    Accepted: ``.safetensors`` (a flat state dict, or this package's checkpoint: its
    ``state_dict``), or a torch pickle (``.pt``/``.pth``/``.bin``) holding a state dict, bare or
    under ``state_dict``/``model``/``model_state_dict``; a common ``module.`` prefix is removed.
    Raises ``FileNotFoundError``, ``UnsafeCheckpointError`` (the pickle needs more than tensors
    and plain containers) and ``CheckpointError`` (truncated, no state dict), naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the weights file is empty (0 bytes)")
    with open(path, "rb") as handle:
        head = handle.read(8)
    is_pickle = head[:2] == b"PK" or head[:1] == b"\x80"  # zip archive (torch.save) or raw pickle
    if path.suffix == SUFFIX or not is_pickle:
        tensors, metadata = _read_safetensors(path)
        if HEADER_KEY in metadata:
            state = load_tree(path).get("state_dict")
            if not isinstance(state, dict):
                raise CheckpointError(f"{path}: endoExplain file without a state_dict (a resume state?)")
            return _clean_state_dict(state, path)
        return _clean_state_dict(tensors, path)
    check_declared_size(path, head)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()
        reason = next((line.strip() for line in first_line if "GLOBAL" in line or "Unsupported" in line),
                      first_line[0] if first_line else "")
        raise UnsafeCheckpointError(
            f"{path}: refused: reading it would run code from the file ({reason}). Only tensors "
            f"and plain containers are loaded; save the weights with model.state_dict() or as "
            f"safetensors") from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: cannot read the weights file (truncated or damaged?): "
                              f"{_first_line(error)}") from error
    if isinstance(loaded, dict):
        for key in ("state_dict", "model", "model_state_dict"):
            if isinstance(loaded.get(key), dict):
                loaded = loaded[key]
                break
    return _clean_state_dict(loaded, path)


def _first_line(error: BaseException, limit: int = 160) -> str:
    """The first sentence of an error message, so that a refusal fits on one line."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.split(". ")[0][:limit]


def _clean_state_dict(state: Any, path: Path) -> dict[str, torch.Tensor]:
    """Check ``state`` maps names to tensors; strip a ``module.`` prefix common to all keys."""
    if not isinstance(state, dict) or not state:
        raise CheckpointError(f"{path}: holds no state dict (got {type(state).__name__})")
    not_tensors = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise CheckpointError(f"{path}: not a state dict: entries {not_tensors[:3]} are not tensors")
    if all(str(k).startswith("module.") for k in state):
        state = {str(k)[len("module."):]: v for k, v in state.items()}
    return dict(state)
