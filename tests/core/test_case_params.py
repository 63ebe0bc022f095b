"""Backend parameters live in a case's ``params``, declared once (core/knobs.py, a plugin's
module), and keys written when they were case fields still name the same cases."""

import json
from pathlib import Path

import pytest

from attnbench.core import knobs
from attnbench.core.case import Case
from attnbench.core.record import Record

ROOT = Path(__file__).resolve().parents[2]
# Fixture runs only (old records among them): adding or removing a published run never
# changes the test suite
RUNS = sorted(ROOT.glob("tests/fixtures/**/records.jsonl"))


def _case_rows(path: Path) -> list[dict]:
    """The rows of a run that record a case (model-step runs key their own rows)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "key" in r and "heads_q" in r and "backend" in r]


def test_every_fixture_run_is_read():
    assert len(RUNS) >= 5 and sum(len(_case_rows(p)) for p in RUNS) > 100


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recorded_key_reads_back_byte_for_byte(path):
    for row in _case_rows(path):
        assert Case.from_key(row["key"]).key == row["key"]  # the key -> case -> key
        rebuilt = Record.from_row(row)  # the record's columns -> case -> key
        assert rebuilt.key == row["key"]
        written = rebuilt.case.to_dict()
        if set(written) <= set(row):  # a run that wrote every column: written byte for byte
            assert json.dumps(written) == json.dumps({k: row[k] for k in written})
        else:  # an older run: the columns it has
            assert {k: v for k, v in written.items() if k in row} == {
                k: row[k] for k in written if k in row}


def test_a_parameter_is_read_through_one_accessor_with_its_declared_default():
    case = Case(block_size=32)
    assert case.param("block_size") == 32 and case.param("block_band") == 1
    assert case.params == (("block_size", 32),)
    assert Case(params={"block_size": 64}) == Case()  # a default is no parameter given
    assert Case(params="alpha=2").param("alpha") == 2
    assert Case().param("alpha", 7) == 7
    with pytest.raises(KeyError):
        Case().param("alpha")


def test_named_mapping_and_text_spellings_are_one_case():
    named = Case(feature_map="favor", block_pairs=[[0, 1]])
    assert named == Case(params={"feature_map": "favor", "block_pairs": ((0, 1),)})
    assert named.replace(feature_map="elu") == Case(block_pairs=((0, 1),))
    assert named.with_params(alpha=2).key.endswith("-params=alpha=2")
    assert Case.from_key(named.key) == named


def test_parameters_are_no_fields_of_the_case():
    fields = set(Case.__dataclass_fields__)
    assert not fields & set(knobs.BUILT_IN)
    assert list(Case().to_dict()) == list(Case.columns())
    assert Case.columns() == (  # a record's columns, in the order they have always had
        "batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v", "dtype",
        "device", "mask", "mode", "seed", "block_size", "block_band", "block_global",
        "block_random", "block_pairs", "block_stride", "block_layout_name", "feature_map",
        "num_features", "additive_dim", "linformer_k", "memory_budget_mb", "scale", "inputs",
        "lengths", "page_size", "pages", "params")


def test_keys_write_built_in_parameters_in_their_old_order():
    case = Case(memory_budget_mb=8, block_size=32, feature_map="favor", scale=0.5,
                params="z=1")
    assert case.key.endswith("-block_size=32-feature_map=favor-memory_budget_mb=8-scale=0.5"
                             "-params=z=1")


def test_a_key_that_names_no_case_is_refused():
    with pytest.raises(ValueError, match="not a case key"):
        Case.from_key("hello")


def test_a_where_table_selects_a_case_by_a_parameter():
    from attnbench.core.where import case_matches

    assert case_matches(Case(block_band=2), {"block_band": 2})
    assert not case_matches(Case(), {"block_band": 2})
    assert case_matches(Case(), {"block_band": 1, "feature_map": ["elu", "favor"]})


CASES = [json.loads(line) for line in
         (ROOT / "tests/fixtures/case-columns/cases.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("written", CASES, ids=lambda w: w["key"])
def test_keys_and_columns_are_written_as_when_parameters_were_fields(written):
    """The fixture was written by the Case that held its parameters as fields."""
    case = Case(**written["given"])
    assert case.key == written["key"]
    assert json.dumps(case.to_dict()) == json.dumps(written["columns"])  # byte for byte
    assert Case(**written["columns"]) == case == Case.from_key(written["key"])
