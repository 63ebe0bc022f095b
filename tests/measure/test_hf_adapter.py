"""Every exact attnbench backend plugged into a transformers model gives eager attention's
output (to float32's tolerance): a causal GQA model (tiny Llama), a padded batch, and a
sliding-window model (tiny Mistral). Tiny configs, random weights."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnbench.core.accuracy import errors, tolerance  # noqa: E402
from attnbench.core.backend import EXACT  # noqa: E402
from attnbench.core.errors import NotSupported  # noqa: E402
from attnbench.core.registry import all_backends  # noqa: E402
from attnbench.measure import hf_adapter  # noqa: E402

SKIPPED = hf_adapter.register()
# flex on CPU compiles one inductor kernel per shape (about a minute each on 2 cores): it is
# checked once, on the causal GQA model; the others run every case.
EXACT_HERE = sorted(n for n, b in all_backends().items()
                    if b.semantics == EXACT and b.caps.dense and n not in SKIPPED)
FAST = [n for n in EXACT_HERE if n != "flex"]

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=97, attention_dropout=0.0)


def llama():
    return transformers.LlamaConfig(**TINY)


def mistral(window):
    return transformers.MistralConfig(**TINY, sliding_window=window)


def refusal(backend, mask):
    """The adapter's reasons for a tiny call with this mask (empty: the backend runs it)."""
    from attnbench.core.case import Case

    case = Case(batch=1, heads_q=4, heads_kv=2, seq_q=24, seq_k=24, head_dim=16, head_dim_v=16,
                mask=mask)
    return hf_adapter.adapter(backend).reasons(case)


def pair(cfg, backend):
    torch.manual_seed(0)
    eager = transformers.AutoModel.from_config(cfg, attn_implementation="eager").eval()
    name = hf_adapter.implementation_name(backend)
    plugged = transformers.AutoModel.from_config(cfg, attn_implementation=name).eval()
    plugged.load_state_dict(eager.state_dict())
    return eager, plugged


def outputs(model, ids, mask=None):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, N, hidden)


def assert_same(actual, expected):
    _, rel = errors(actual, expected.double())
    assert rel <= tolerance("float32", "out"), rel


def ids(batch=2, n=24):
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, TINY["vocab_size"], (batch, n), generator=gen)


# flex on the CPU (torch 2.13, inductor) is wrong on these small shapes, plugged in or
# called alone: attnbench.attention(q, k, v, "flex", causal=True) at B=2, Hq=4, Hkv=2, N=24,
# d=16 was off by 1.9 (max abs), and NaN with Hkv=4 or without a mask (N=12 was exact).
FLEX_CPU_SMALL = pytest.mark.xfail(
    reason="flex on CPU returns wrong values / NaN at N=24, d=16 (a flex backend fault, "
           "also seen through attnbench.attention)", strict=False)


@pytest.mark.parametrize("backend", [pytest.param(n, marks=FLEX_CPU_SMALL) if n == "flex"
                                     else n for n in EXACT_HERE])
def test_causal_gqa_model_matches_eager(backend):
    eager, plugged = pair(llama(), backend)
    x = ids()
    if refusal(backend, "causal"):  # e.g. sliding_window runs bounded windows only
        with pytest.raises(NotSupported, match="mask causal"):
            outputs(plugged, x)
        return
    assert_same(outputs(plugged, x), outputs(eager, x))
    cases = hf_adapter.adapter(backend).calls
    assert {(c.heads_q, c.heads_kv, c.mask) for c in cases} == {(4, 2, "causal")}


@pytest.mark.parametrize("backend", FAST)
def test_padded_batch_matches_eager_on_real_tokens(backend):
    eager, plugged = pair(llama(), backend)
    if refusal(backend, "causal"):
        pytest.skip(f"{backend} refuses causal masks (test_causal_gqa_model checks the reason)")
    x = ids(3, 20)
    mask = torch.ones_like(x)
    mask[1, 13:] = 0  # right padding
    mask[2, :6] = 0  # left padding
    a, b = outputs(plugged, x, mask), outputs(eager, x, mask)
    real = mask.bool()
    assert_same(a[real], b[real])


@pytest.mark.parametrize("backend", FAST)
def test_sliding_window_model_matches_eager(backend):
    eager, plugged = pair(mistral(window=5), backend)
    x = ids(2, 24)  # 24 tokens, each sees itself and the 4 before it
    assert_same(outputs(plugged, x), outputs(eager, x))
    assert {c.mask for c in hf_adapter.adapter(backend).calls} >= {"window(4,0)"}
    # the window changes the output: the same model with full causal attention differs
    causal = transformers.AutoModel.from_config(mistral(window=None), attn_implementation="eager")
    causal.load_state_dict(eager.state_dict())
    _, rel = errors(outputs(causal.eval(), x), outputs(eager, x).double())
    assert rel > 1e-3


def test_dropout_in_training_is_refused_with_its_reason():
    cfg = transformers.LlamaConfig(**{**TINY, "attention_dropout": 0.1})
    model = transformers.AutoModel.from_config(
        cfg, attn_implementation=hf_adapter.implementation_name("sdpa")).train()
    with pytest.raises(NotSupported, match="attention dropout p=0.1"):
        model(input_ids=ids())


def test_names_holding_flash_are_spelt_fa():
    assert hf_adapter.implementation_name("sdpa_flash") == "attnbench_sdpa_fa"
    assert hf_adapter.implementation_name("naive") == "attnbench_naive"
