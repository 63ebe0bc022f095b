"""Q, K and V captured from all-MiniLM-L6-v2 (``core/pretrained.py``) on English text.

The text is read at run time from the installed Python standard library: the docstrings of
``TEXT_MODULES``, parsed from their source files (nothing imported, nothing copied into this
repository). It is tokenized with the model's own tokenizer (``tokenizers``) into one stream;
window ``w`` of ``N`` positions is ``[CLS]`` + tokens ``[w (N-2), (w+1) (N-2))`` + ``[SEP]``.
The weights are read with ``safetensors`` and the BERT layers are computed here in float32:
embeddings (word + position + token type 0, LayerNorm), then per layer the attention's input
projections, ``softmax(q k^T / sqrt(32)) v``, output projection, residual and LayerNorm, the
GELU feed-forward, residual and LayerNorm (the test compares every captured tensor with
transformers' BertModel). What a layer captures is its Q, K and V after the projections,
per head, before the softmax: (windows, 12, N, 32) each.

Captures are cached on disk (``$ATTNBENCH_CACHE/captures``) keyed by model, layer, token hash,
N and windows, so a suite computes each one once.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import math
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from attnbench.core import pretrained
from attnbench.core.pretrained import (  # noqa: F401  (check_shape: this module's name too)
    HEAD_DIM,
    HEADS,
    LAYERS,
    MAX_POSITIONS,
    check_shape,
)

MODEL = "all-MiniLM-L6-v2"
TEXT_MODULES = ("argparse", "collections", "functools", "inspect", "json", "logging",
                "pathlib", "subprocess", "textwrap", "typing", "unittest.case", "dataclasses",
                "email.message", "http.client", "tarfile", "zipfile", "statistics", "string")
LN_EPS = 1e-12
PACKAGES = ("safetensors", "tokenizers")


def unavailable_reason() -> str | None:
    """Why captured inputs cannot be made here (None when they can)."""
    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        return (f"captured inputs need {', '.join(missing)}; install them with: "
                f"{pretrained.INSTALL}")
    return pretrained.unavailable_reason()


@lru_cache(maxsize=1)
def text() -> tuple[str, str]:
    """(the text, where it comes from): the standard library modules' docstrings."""
    docs, used = [], []
    for name in TEXT_MODULES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if not origin or not origin.endswith(".py"):
            continue
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node)
            if doc:
                docs.append(" ".join(doc.split()))
        used.append(name)
    version = ".".join(map(str, sys.version_info[:3]))
    return "\n".join(docs), f"Python {version} standard library docstrings ({', '.join(used)})"


@lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(pretrained.model_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


@lru_cache(maxsize=1)
def tokens() -> tuple[torch.Tensor, str]:
    """The text's token ids (no special tokens) and their sha256."""
    ids = torch.tensor(_tokenizer().encode(text()[0], add_special_tokens=False).ids,
                       dtype=torch.int32)
    return ids, hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def windows(n: int, first: int, count: int) -> torch.Tensor:
    """Token ids (count, n): windows ``first .. first+count-1`` of the stream, each
    ``[CLS] text [SEP]``."""
    ids, _ = tokens()
    tok = _tokenizer()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    body = n - 2
    need = (first + count) * body
    if need > len(ids):
        raise ValueError(f"the text has {len(ids)} tokens; windows {first}..{first + count - 1}"
                         f" of {body} need {need}")
    rows = ids[first * body: need].view(count, body).long()
    return torch.cat([torch.full((count, 1), cls), rows, torch.full((count, 1), sep)], dim=1)


@lru_cache(maxsize=1)
def weights() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(
        str(pretrained.model_dir() / "model.safetensors")).items()}


def _ln(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w[f"{name}.weight"],
                                          w[f"{name}.bias"], LN_EPS)


def _lin(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    return torch.nn.functional.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])


def _heads(x: torch.Tensor) -> torch.Tensor:
    B, N, _ = x.shape
    return x.view(B, N, HEADS, HEAD_DIM).transpose(1, 2)  # (B, 12, N, 32)


def forward(ids: torch.Tensor, upto: int) -> dict[str, torch.Tensor]:
    """The BERT encoder on ``ids`` (B, N) through layer ``upto``: that layer's input
    ``hidden`` (B, N, 384), its ``q``, ``k``, ``v`` (B, 12, N, 32), its attention ``context``
    (B, N, 384, before the output projection) and its output ``out`` (B, N, 384)."""
    w = weights()
    B, N = ids.shape
    with torch.no_grad():
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:N]
             + w["embeddings.token_type_embeddings.weight"][0])  # (B, N, 384)
        x = _ln(x, w, "embeddings.LayerNorm")
        for layer in range(upto + 1):
            p = f"encoder.layer.{layer}."
            q, k, v = (_heads(_lin(x, w, p + f"attention.self.{n}"))
                       for n in ("query", "key", "value"))
            probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM), dim=-1)
            context = (probs @ v).transpose(1, 2).reshape(B, N, HEADS * HEAD_DIM)
            attn = _ln(_lin(context, w, p + "attention.output.dense") + x, w,
                       p + "attention.output.LayerNorm")
            inter = torch.nn.functional.gelu(_lin(attn, w, p + "intermediate.dense"))
            out = _ln(_lin(inter, w, p + "output.dense") + attn, w, p + "output.LayerNorm")
            if layer == upto:
                return {"hidden": x, "q": q, "k": k, "v": v, "context": context, "out": out}
            x = out
    raise ValueError(f"layer {upto} is not in 0..{LAYERS - 1}")


def _cache_path(layer: int, n: int, first: int, count: int, token_hash: str) -> Path:
    return (pretrained.cache_root() / "captures"
            / f"{MODEL}-L{layer}-t{token_hash[:16]}-N{n}-w{first}+{count}.pt")


def capture(layer: int, n: int, first: int, count: int) -> tuple[torch.Tensor, ...]:
    """(q, k, v), each (count, 12, n, 32) float32, of ``layer`` on windows ``first ..``;
    read from the disk cache when there, else computed and written atomically."""
    _, token_hash = tokens()
    path = _cache_path(layer, n, first, count, token_hash)
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return saved["q"], saved["k"], saved["v"]
    got = forward(windows(n, first, count), layer)
    qkv = {name: got[name].contiguous() for name in ("q", "k", "v")}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="partial-", suffix=".pt.tmp", dir=path.parent)
    os.close(fd)
    torch.save(qkv, tmp)
    os.replace(tmp, path)
    return qkv["q"], qkv["k"], qkv["v"]


def captured_qkv(layer: int, batch: int, heads_q: int, heads_kv: int, seq_q: int,
                 seq_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """A case's q (B, Hq, Nq, 32), k and v (B, Hkv, Nk, 32) and what to record about them.

    Batch element b is text window ``seed * batch + b`` (seq_k positions). Query heads are the
    model's heads 0..Hq-1; the queries are the window's last seq_q positions (bottom-right,
    like the masks). With fewer key/value heads (GQA), kv head j is the mean of the model's
    K and V over the query heads of its group, the mean-pooling conversion of a multi-head
    checkpoint to grouped-query attention (Ainslie et al. 2023)."""
    q, k, v = capture(layer, seq_k, seed * batch, batch)
    q = q[:, :heads_q, seq_k - seq_q:]  # (B, Hq, Nq, 32)
    group = heads_q // heads_kv
    k, v = (t[:, :heads_q].unflatten(1, (heads_kv, group)).mean(2)  # (B, Hkv, Nk, 32)
            for t in (k, v))
    ids_hash = tokens()[1]
    info = {"inputs_source": f"{MODEL} layer {layer} Q/K/V on {text()[1]}, windows "
                             f"{seed * batch}..{seed * batch + batch - 1} of {seq_k} tokens",
            "inputs_token_hash": ids_hash}
    return q.contiguous(), k.contiguous(), v.contiguous(), info
