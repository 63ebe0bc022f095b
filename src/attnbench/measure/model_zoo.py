"""The models a model-level run builds, and their inputs.

``minilm`` is all-MiniLM-L6-v2 with its trained weights (``core/pretrained.py``) on real text:
the docstrings of Python's standard library, read at run time. The others are built from
configurations with random weights (seeded), at three scales: ``tiny`` (tests), ``cpu``
(2 cores, seconds per step) and ``h200`` (the published models' layer width, head counts and
window, fewer layers). Attention dropout is 0 everywhere (no attnbench backend drops
probabilities); other dropout is off because the models run in eval mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from attnbench.core.pretrained import model_dir

# Per architecture and scale: the config fields that differ from transformers' defaults.
# cpu: head_dim 64 and the published mask and GQA group (Llama 3's 4:1), 2 layers of width
# 256, so that a training step at N = 1024 takes a fraction of a second on 2 cores.
# h200: hidden size, heads, KV heads and window as published (Llama 3 8B, Mistral 7B v0.1,
# GPT-2 small, BERT-base); layers cut to 4 to keep the H200 check within its budget.
CONFIGS = {
    "llama3": {
        "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2),
        "cpu": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1),
        "h200": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                     num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0),
    },
    "mistral": {
        "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, sliding_window=8),
        "cpu": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, sliding_window=256),
        "h200": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                     num_attention_heads=32, num_key_value_heads=8, sliding_window=4096),
    },
    "gpt2": {
        "tiny": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
        "cpu": dict(n_embd=256, n_layer=2, n_head=4, n_positions=1024),
        "h200": dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024),
    },
    "bert": {
        "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4),
        "cpu": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                    num_attention_heads=4),
        "h200": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                     num_attention_heads=12),
    },
}
CONFIG_CLASSES = {"llama3": "LlamaConfig", "mistral": "MistralConfig", "gpt2": "GPT2Config",
                  "bert": "BertConfig"}
DROPOUT_OFF = {"llama3": {"attention_dropout": 0.0}, "mistral": {"attention_dropout": 0.0},
               "gpt2": {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
               "bert": {"attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.0}}
REAL = "minilm"
MODELS = (REAL, *CONFIGS)
SCALES = ("tiny", "cpu", "h200")
VOCAB = 4096  # random-weight models: a small vocabulary (embedding size is not attention)

# Standard-library modules whose docstrings are the real text MiniLM reads.
TEXT_MODULES = ("collections", "itertools", "functools", "json", "argparse", "pathlib",
                "subprocess", "threading", "asyncio", "logging", "unittest", "typing",
                "dataclasses", "statistics", "decimal", "fractions", "random", "re", "string",
                "textwrap", "difflib", "heapq", "bisect", "contextlib", "inspect", "pickle")


@dataclass
class BuiltModel:
    name: str
    weights: str  # "real" or "random"
    model: torch.nn.Module
    inputs: dict  # keyword arguments of the model's forward
    pooled: bool  # whether drift is the cosine of mean-pooled embeddings


def _config(name: str, scale: str):
    import transformers

    if name == REAL:
        data = json.loads((model_dir() / "config.json").read_text())
        data.update(DROPOUT_OFF["bert"])
        return transformers.BertConfig(**{k: v for k, v in data.items()
                                          if not k.startswith("_")})
    fields = {**CONFIGS[name][scale], **DROPOUT_OFF[name]}
    fields["vocab_size"] = VOCAB
    return getattr(transformers, CONFIG_CLASSES[name])(**fields)


def real_text() -> str:
    """The docstrings of ``TEXT_MODULES`` (and of their public members), read now."""
    import importlib
    import inspect

    parts = []
    for module_name in TEXT_MODULES:
        module = importlib.import_module(module_name)
        parts.append(inspect.getdoc(module) or "")
        for member in sorted(vars(module)):
            if not member.startswith("_"):
                parts.append(inspect.getdoc(getattr(module, member)) or "")
    return "\n\n".join(p for p in parts if p)


def minilm_ids(batch: int, seq_len: int) -> torch.Tensor:
    """(batch, seq_len) token ids: consecutive windows of the real text, each a full
    sequence ([CLS] ... [SEP]) with no padding."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    ids = tok.encode(real_text(), add_special_tokens=False).ids
    body = seq_len - 2
    if len(ids) < batch * body:
        raise ValueError(f"the standard-library text has {len(ids)} tokens, fewer than "
                         f"batch {batch} x {body}")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rows = [[cls, *ids[i * body:(i + 1) * body], sep] for i in range(batch)]
    return torch.tensor(rows, dtype=torch.long)


def build(name: str, scale: str, batch: int, seq_len: int, dtype: torch.dtype,
          device: str, seed: int = 0) -> BuiltModel:
    """The model (eager attention, eval mode) and its inputs."""
    import transformers

    cfg = _config(name, scale)
    if name == REAL:
        model = transformers.BertModel.from_pretrained(str(model_dir()), config=cfg,
                                                       attn_implementation="eager")
        ids = minilm_ids(batch, seq_len)
        weights = "real"
    else:
        torch.manual_seed(seed)
        model = transformers.AutoModel.from_config(cfg, attn_implementation="eager")
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (batch, seq_len), generator=gen)
        weights = "random"
    model = model.to(device=device, dtype=dtype).eval()
    return BuiltModel(name, weights, model, {"input_ids": ids.to(device)}, name == REAL)
