"""Backend parameters declared as data (core/params.py) and checked from that declaration:
by the suite loader (one line naming file, key, value and what is allowed) and by the
backend's own not_supported_reasons."""

import pytest

from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.core.params import Param
from attnbench.core.registry import all_backends, get_backend
from attnbench.runs.suite import load_suite

KNOWN = sorted(all_backends())
SWEEP = """
name = "p"
[[sweep]]
backends = ["sdpa", "{backend}"]
[sweep.axes]
seq_len = 64
head_dim = 8
{line}
"""


@pytest.mark.parametrize("param, value, problem", [
    (Param(int, 1, minimum=1), 0, "allowed: a positive integer"),
    (Param(int, 0, minimum=0), -1, "allowed: an integer >= 0"),
    (Param(int, 0), "3", "allowed: an integer"),
    (Param(int, 0), True, "allowed: an integer"),
    (Param(int, 0), 2**64, "allowed: an integer"),
    (Param(str, "a", choices=("a", "b")), "c", "allowed: a, b"),
    (Param(str, "a"), 3, "must be a string"),
])
def test_a_declaration_names_what_is_allowed(param, value, problem):
    assert problem in param.problem(value)
    assert param.problem(param.default) is None


@pytest.mark.parametrize("backend, line, message", [
    ("linear", 'feature_map = "relu"', "sweep[0].axes.feature_map = 'relu': a parameter of "
                                       "linear; allowed: elu, favor"),
    ("linear", "num_features = 0", "sweep[0].axes.num_features = 0: a parameter of linear; "
                                   "allowed: a positive integer"),
    ("linformer", "linformer_k = [16, -2]", "sweep[0].axes.linformer_k = -2: a parameter of "
                                            "linformer; allowed: a positive integer"),
    ("additive", "additive_dim = -1", "additive_dim = -1: a parameter of additive; allowed: "
                                      "an integer >= 0"),
    ("additive", "memory_budget_mb = 0", "a parameter of additive; allowed: a positive"),
    # a parameter of another backend is still checked against its one declaration
    ("naive", 'block_layout_name = "zigzag"', "a parameter of block_sparse; allowed: local, "
                                              "bigbird"),
])
def test_the_suite_checks_parameters_against_their_declaration(write_suite, backend, line,
                                                               message):
    path = write_suite(SWEEP.format(backend=backend, line=line))
    with pytest.raises(BadInput) as exc:
        load_suite(str(path), KNOWN)
    text = str(exc.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text
    # loaded without the registry, the same line comes from check_backends
    suite = load_suite(str(path))
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("(", r"\(")):
        suite.check_backends(KNOWN)


def test_good_parameters_load(write_suite):
    path = write_suite(SWEEP.format(backend="linear", line='feature_map = ["elu", "favor"]'))
    assert len(load_suite(str(path), KNOWN).jobs()) == 4


@pytest.mark.parametrize("backend, change, word", [
    ("linear", dict(num_features=0), "num_features"),
    ("linear", dict(feature_map="relu"), "feature_map"),
    ("linformer", dict(linformer_k=0), "linformer_k"),
    ("additive", dict(memory_budget_mb=0), "memory_budget_mb"),
    ("additive", dict(additive_dim=-3), "additive_dim"),
])
def test_a_backend_refuses_values_its_declaration_does_not_allow(backend, change, word):
    case = Case(seq_q=32, seq_k=32, head_dim=8, head_dim_v=8, heads_q=2, heads_kv=2, **change)
    reasons = get_backend(backend).not_supported_reasons(case)
    assert len([r for r in reasons if word in r]) == 1, reasons
    assert get_backend("sdpa").not_supported_reasons(case) == []  # not its parameter


def test_every_declared_default_is_the_case_default():
    for b in all_backends().values():
        for name, param in b.params.items():
            assert param.problem(param.default) is None, (b.name, name)
            if name in Case.columns():
                assert Case().param(name) == param.default, (b.name, name)
