"""The ``lengths`` axis: a packed variable-length batch, each row split into documents.

A case with ``lengths`` keeps its shape: ``batch`` rows of ``seq_q`` (= ``seq_k``) tokens,
so the batch's total tokens are ``batch * seq_q`` whatever the distribution, and cases of
different distributions compare at equal total tokens. Each row is a packed sequence of
documents that attend only within themselves (causal or not, as the mask says). The
documents' lengths are drawn from the case ``seed``, row after row: lengths are drawn until
the row is full, and the last document of a row is cut to what is left of it (a document
longer than a row is cut to the row, as a packer truncates).

Forms (``parse``):

* ``fixed(n)``: every document ``n`` tokens;
* ``uniform(lo,hi)``: integers uniform in ``[lo, hi]``;
* ``lognormal(median,sigma)``: ``round(median * exp(sigma * z))``, at least 1 (the skewed
  lengths of real corpora);
* ``text(package)``: the token lengths of real documents read at run time: the module
  docstrings of the installed ``package``'s Python files (e.g. ``text(torch)``), each
  tokenized with all-MiniLM-L6-v2's tokenizer (``[CLS]`` and ``[SEP]`` included), taken in
  an order shuffled by the seed. Needs ``tokenizers`` and the model package
  (``core/pretrained.py``); elsewhere backends record ``unsupported`` with the install
  command. Records carry the source and the sha256 of its lengths list.

Work is counted over within-document pairs only (``document_pairs``); records carry the
summary (``summary``): count, max, mean and the padding fraction ``1 - total / (count *
max)``, what padding every document to the longest wastes. Parsing and drawing need no torch.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import math
import random
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FORMS = "fixed(n), uniform(lo,hi), lognormal(median,sigma), text(package)"
# name -> (knob names, kind of each knob)
KINDS = {
    "fixed": (("n",), (int,)),
    "uniform": (("lo", "hi"), (int, int)),
    "lognormal": (("median", "sigma"), (float, float)),
    "text": (("package",), (str,)),
}
_SPEC = re.compile(r"^\s*([a-z_]+)\s*\(([^()]*)\)\s*$")
_PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class LengthsUnavailable(RuntimeError):
    """The documents cannot be drawn here (a text source that is not installed)."""


@dataclass(frozen=True)
class LengthsSpec:
    kind: str
    knobs: tuple

    def __str__(self) -> str:
        return f"{self.kind}({','.join(_fmt(x) for x in self.knobs)})"


def _fmt(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def parse(text: str) -> LengthsSpec:
    """The spec of ``text``; ValueError (one line) names the allowed forms."""
    m = _SPEC.match(str(text))
    if not m or m.group(1) not in KINDS:
        raise ValueError(f"unknown lengths {text!r}; allowed: {FORMS}")
    kind = m.group(1)
    raw = [a.strip() for a in m.group(2).split(",")] if m.group(2).strip() else []
    names, types = KINDS[kind]
    if len(raw) != len(names):
        raise ValueError(f"lengths {text!r}: {kind} takes {', '.join(names)}; allowed: {FORMS}")
    knobs = []
    for name, typ, value in zip(names, types, raw):
        if typ is str:
            if not _PACKAGE.match(value):
                raise ValueError(f"lengths {text!r}: {name} must be an importable package "
                                 f"name, e.g. torch")
            knobs.append(value)
            continue
        try:
            number = typ(value)
        except ValueError:
            raise ValueError(f"lengths {text!r}: {name} must be "
                             f"{'an integer' if typ is int else 'a number'}") from None
        if not math.isfinite(number) or number < (0 if name == "sigma" else 1):
            raise ValueError(f"lengths {text!r}: {name} must be "
                             f"{'>= 0' if name == 'sigma' else '>= 1'}")
        knobs.append(number)
    if kind == "uniform" and knobs[0] > knobs[1]:
        raise ValueError(f"lengths {text!r}: lo must be <= hi")
    return LengthsSpec(kind, tuple(knobs))


def shape_problem(text: str, seq_q: int, seq_k: int, mask: str) -> str | None:
    """Why a case of this shape and mask cannot be a packed batch (None when it can)."""
    if seq_q != seq_k:
        return (f"lengths {text}: a packed batch is self-attention; needs seq_q == seq_k, "
                f"got {seq_q} and {seq_k}")
    from attnbench.core.masks import per_document_names

    allowed = per_document_names()  # documents attend within themselves, causal or not
    if str(mask).split("(")[0] not in allowed:
        return f"lengths {text}: mask {mask} not allowed; allowed: {', '.join(allowed)}"
    return None


# ---- text sources -------------------------------------------------------------------------
def _module_docstring(path: Path) -> str | None:
    """A Python file's module docstring, read from its first tokens (nothing imported)."""
    try:
        with tokenize.open(path) as fh:
            for tok in tokenize.generate_tokens(fh.readline):
                if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                tokenize.ENCODING):
                    continue
                if tok.type != tokenize.STRING:
                    return None
                value = ast.literal_eval(tok.string)
                return value if isinstance(value, str) else None
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, tokenize.TokenError):
        return None
    return None


def _package_root(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def text_unavailable_reason(package: str) -> str | None:
    """Why ``text(package)`` cannot be read here (None when it can)."""
    from attnbench.core import pretrained

    if _package_root(package) is None:
        return f"lengths text({package}): no installed package {package!r} to read"
    if importlib.util.find_spec("tokenizers") is None:
        return (f"lengths text({package}) needs tokenizers; install it with: "
                f"{pretrained.INSTALL}")
    why = pretrained.unavailable_reason()
    return f"lengths text({package}): {why}" if why else None


@lru_cache(maxsize=4)
def text_lengths(package: str) -> tuple[tuple[int, ...], str, str]:
    """(token lengths of the package's module docstrings, where they come from, sha256 of
    the lengths list). LengthsUnavailable names the install command when they cannot be."""
    why = text_unavailable_reason(package)
    if why:
        raise LengthsUnavailable(why)
    from tokenizers import Tokenizer

    from attnbench.core import pretrained

    root = _package_root(package)
    files = sorted(root.rglob("*.py"))
    docs = [" ".join(d.split()) for d in map(_module_docstring, files) if d and d.strip()]
    tok = Tokenizer.from_file(str(pretrained.model_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    lengths = tuple(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=True))
    if not lengths:
        raise LengthsUnavailable(f"lengths text({package}): no module docstrings in {root}")
    digest = hashlib.sha256(",".join(map(str, lengths)).encode()).hexdigest()
    try:
        from importlib import metadata

        version = f" {metadata.version(package)}"
    except Exception:
        version = ""
    source = (f"module docstrings of {len(lengths)} of {package}{version}'s {len(files)} "
              f"Python files, tokenized by all-MiniLM-L6-v2's tokenizer (sha256 {digest[:16]})")
    return lengths, source, digest


def unavailable_reason(text: str) -> str | None:
    """Why the documents of ``text`` cannot be drawn here (None when they can)."""
    spec = parse(text)
    return text_unavailable_reason(spec.knobs[0]) if spec.kind == "text" else None


# ---- drawing ------------------------------------------------------------------------------
def _stream(spec: LengthsSpec, rng: random.Random):
    """Endless document lengths (each >= 1) of a spec."""
    if spec.kind == "fixed":
        while True:
            yield spec.knobs[0]
    if spec.kind == "uniform":
        while True:
            yield rng.randint(*spec.knobs)
    if spec.kind == "lognormal":
        median, sigma = spec.knobs
        while True:
            yield max(1, round(median * math.exp(sigma * rng.gauss(0.0, 1.0))))
    if spec.kind == "text":
        lengths = text_lengths(spec.knobs[0])[0]
        order = list(range(len(lengths)))
        rng.shuffle(order)
        while True:
            for i in order:
                yield lengths[i]
    raise ValueError(f"unknown lengths kind {spec.kind!r}")


@lru_cache(maxsize=256)
def draw(text: str, batch: int, seq: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """Per row, its documents' lengths (each >= 1, summing to ``seq``), from ``seed``."""
    spec = parse(text)
    stream = _stream(spec, random.Random(seed))
    rows = []
    for _ in range(batch):
        row, left = [], seq
        while left:
            n = min(next(stream), left)
            row.append(n)
            left -= n
        rows.append(tuple(row))
    return tuple(rows)


# ---- counts and summary -------------------------------------------------------------------
def document_pairs(rows, causal: bool) -> int:
    """Query-key pairs within documents, summed over every document of every row: the work
    of a packed batch (n^2 per document, or n (n + 1) / 2 causal)."""
    return sum(n * (n + 1) // 2 if causal else n * n for row in rows for n in row)


def summary(rows) -> dict:
    """count, max, mean of the documents and the padding fraction 1 - total / (count * max)
    (the share of a batch padded to its longest document that is padding)."""
    docs = [n for row in rows for n in row]
    total, count, longest = sum(docs), len(docs), max(docs)
    return {"count": count, "max": longest, "mean": total / count,
            "padding_frac": 1.0 - total / (count * longest)}


def visible_pairs_per_row(text: str, batch: int, seq: int, seed: int, causal: bool) -> float:
    """Within-document pairs per row (their mean over the rows). Where the documents cannot
    be drawn here, the dense count bounds it: such a case runs no backend, so only a plan's
    estimate reads it."""
    try:
        rows = draw(text, batch, seq, seed)
    except LengthsUnavailable:
        rows = ((seq,),) * batch
    return document_pairs(rows, causal) / batch


def record_columns(case) -> dict:
    """What a packed case's records say about its documents (``core/record.py``)."""
    rows = draw(case.lengths, case.batch, case.seq_q, case.seed)
    s = summary(rows)
    cols = {f"lengths_{k}": v for k, v in s.items()}
    cols["lengths_hash"] = hashlib.sha256(
        ";".join(",".join(map(str, r)) for r in rows).encode()).hexdigest()
    spec = parse(case.lengths)
    if spec.kind == "text":
        cols["lengths_source"] = text_lengths(spec.knobs[0])[1]
    return cols
