"""A backend with its own parameter, added as a plugin through the ``attnbench.backends``
entry point (one file and a suite entry, nothing in core), run end to end: its parameter is
given to its cases only, checked against its declaration, and carried by its records."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from attnbench.core.case import Case
from attnbench.core.errors import BadInput
from attnbench.runs.suite import load_suite

PLUGIN = '''
import torch

from attnbench.core.backend import Backend, Capabilities
from attnbench.core.params import Param


class Chunked(Backend):
    name = "chunked"
    description = "softmax attention over query blocks computed one at a time"
    caps = Capabilities(masks=("none", "causal"), gqa=False)
    params = {"chunks": Param(int, 1, minimum=1, doc="query blocks, one at a time")}

    def build(self, case, inputs):
        chunks = self.param(case, "chunks")
        mask = None
        if case.mask == "causal":
            mask = torch.ones(case.seq_q, case.seq_k, dtype=torch.bool).tril(
                case.seq_k - case.seq_q)  # (Nq, Nk)

        def f(q, k, v):
            outs = []
            for rows in torch.arange(case.seq_q).chunk(chunks):
                s = q[:, :, rows] @ k.transpose(-1, -2) * case.softmax_scale  # (B, H, r, Nk)
                if mask is not None:
                    s = s.masked_fill(~mask[rows], float("-inf"))
                outs.append(torch.softmax(s, dim=-1) @ v)
            return torch.cat(outs, dim=2)  # (B, H, Nq, Dv)

        return f


BACKENDS = [Chunked()]
'''
ENTRY_POINTS = "[attnbench.backends]\nchunked = chunked_plugin:BACKENDS\n"
SUITE = """
name = "plugin"
[timing]
warmup_s = 0.001
budget_s = 0.01
[[sweep]]
backends = ["naive", "chunked"]
[sweep.axes]
heads_q = 2
head_dim = 16
seq_len = 32
mask = ["none", "causal"]
[sweep.params.chunked]
{line}
"""


@pytest.fixture
def plugin_site(tmp_path):
    """A folder holding the plugin module and an installed distribution's metadata that
    names it in the entry-point group, as ``pip install`` of a plugin package leaves."""
    site = tmp_path / "site"
    info = site / "chunked_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "chunked_plugin.py").write_text(PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: chunked-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


def cli(site, cwd, *args):
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("ATTNBENCH_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "attnbench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_plugin_parameter_runs_end_to_end(tmp_path, plugin_site):
    suite = tmp_path / "plugin.toml"
    suite.write_text(SUITE.format(line="chunks = [1, 4]"))
    proc = cli(plugin_site, tmp_path, "run", "--suite", str(suite), "--out", "res",
               "--reports", "rep", "--run-id", "p1", "--no-progress", "--no-isolate")
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line)
            for line in (tmp_path / "res" / "p1" / "records.jsonl").read_text().splitlines()]
    seen = sorted((r["backend"], r["mask"], r["params"]) for r in recs)
    assert seen == [("chunked", "causal", "chunks=1"), ("chunked", "causal", "chunks=4"),
                    ("chunked", "none", "chunks=1"), ("chunked", "none", "chunks=4"),
                    ("naive", "causal", ""), ("naive", "none", "")]
    assert {r["status"] for r in recs} == {"ok"}
    assert all(r["err_impl_out_rel"] < 1e-5 for r in recs)
    # the parameter is in its own records' keys only
    keys = {(r["backend"], r["params"]): r["key"] for r in recs if r["mask"] == "none"}
    assert "chunks" not in keys[("naive", "")]
    assert keys[("chunked", "chunks=4")] == keys[("naive", "")] + "-params=chunks=4"


@pytest.mark.parametrize("line, fragments", [
    ("chunks = 0", ["plugin.toml: sweep[0].params.chunked.chunks = 0: allowed: a positive "
                    "integer"]),
    ("chunk = 2", ["sweep[0].params.chunked.chunk = 2: not a parameter of chunked; allowed: "
                   "chunks"]),
    ('chunks = "many"', ["chunks = 'many': allowed: a positive integer"]),
])
def test_a_bad_plugin_parameter_is_one_line_and_exit_2(tmp_path, plugin_site, line,
                                                       fragments):
    suite = tmp_path / "plugin.toml"
    suite.write_text(SUITE.format(line=line))
    proc = cli(plugin_site, tmp_path, "run", "--suite", str(suite), "--no-progress")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert all(f in lines[0] for f in fragments), lines[0]
    assert not (tmp_path / "results").exists()


OWN = textwrap.dedent("""
    name = "own"
    [[sweep]]
    backends = ["sdpa", "linear"]
    [sweep.axes]
    seq_len = [32, 64]
    head_dim = 8
    [sweep.params.linear]
    feature_map = ["elu", "favor"]
    num_features = 16
""")


def test_a_backends_own_parameters_enter_its_cases_only(write_suite):
    suite = load_suite(str(write_suite(OWN)), ["sdpa", "linear"])
    jobs = suite.jobs()
    assert len(jobs) == 2 * (1 + 2)
    assert suite.pair_bounds("cpu") == (6, 6)
    sdpa = [c for c, b in jobs if b == "sdpa"]
    assert all(c.param("feature_map") == "elu" and c.param("num_features") == 256 for c in sdpa)
    linear = {(c.seq_q, c.param("feature_map"), c.param("num_features"))
              for c, b in jobs if b == "linear"}
    assert linear == {(n, f, 16) for n in (32, 64) for f in ("elu", "favor")}
    assert all("num_features" not in c.key for c in sdpa)


@pytest.mark.parametrize("table, message", [
    ("[sweep.params.naive]\nalpha = 1", "sweep[0].params.naive = {'alpha': 1}: not a backend "
                                         "of this sweep; allowed: sdpa, linear"),
    ("[sweep.params.linear]\nseq_len = 8", "params.linear.seq_len = 8: a problem axis"),
    ("[sweep.params.linear]\nfeature_map = 'relu'", "params.linear.feature_map = 'relu': "
                                                    "allowed: elu, favor"),
    ("[sweep.params.sdpa]\nfeature_map = 'elu'", "params.sdpa.feature_map = 'elu': not a "
                                                 "parameter of sdpa; allowed: none"),
    ("[sweep.params.linear]\nx = 'a,b'", "params.linear.x = 'a,b': allowed: an integer"),
])
def test_bad_backend_parameters_are_one_line(write_suite, table, message):
    text = OWN.split("[sweep.params.linear]")[0] + table + "\n"
    with pytest.raises(BadInput) as exc:
        load_suite(str(write_suite(text)), ["sdpa", "linear"])
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_params_text_is_canonical_and_rebuilds_the_case():
    case = Case(params="z=x,alpha=2")
    assert case.to_dict()["params"] == "alpha=2,z=x"
    assert Case(**case.to_dict()).key == case.key
