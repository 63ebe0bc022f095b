"""Inputs and float64 references reused across the jobs of a run, within a byte budget.

A suite visits the same inputs many times: every backend of a case, every mask and every
mode of a shape (the h200 suite: 154 jobs over 12 input shapes). Inputs depend only on the
shape, dtype, device and seed, so one set serves them all; the exact reference depends on
the mask too, and one with gradients serves the forward modes as well. Entries are kept
least-recently-used first out, up to a byte budget (a tenth of the GPU's memory; 512 MiB on
the CPU, where a worker's address space may be capped by ``--max-memory``).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from attnbench.core import inputs_properties
from attnbench.core.case import Case, Inputs
from attnbench.core.reference import RefResult, case_reference

CPU_BUDGET_BYTES = 512 * 2**20
CUDA_BUDGET_FRACTION = 0.10


def inputs_key(case: Case) -> tuple:
    """What a case's inputs depend on: not the mask, the mode or the backend."""
    return (case.batch, case.heads_q, case.heads_kv, case.seq_q, case.seq_k, case.head_dim,
            case.head_dim_v, case.dtype, case.device, case.seed, case.inputs)


def reference_key(case: Case) -> tuple:
    """What the exact reference depends on beyond the inputs: the mask (with its block
    layout and knobs) and the scale; the mode only through whether gradients are needed."""
    return (inputs_key(case), case.replace(mode="fwd").key)


def budget_bytes(device: str) -> int:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(dev.index or 0).total_memory
        return int(total * CUDA_BUDGET_FRACTION)
    return CPU_BUDGET_BYTES


def _nbytes(value) -> int:
    tensors = (value.as_dict().values() if isinstance(value, RefResult)
               else [value.q, value.k, value.v, value.grad_out])
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class CaseCache:
    """Inputs and exact references, shared by the jobs that need the same ones."""

    def __init__(self, budget: int | None = None):
        self.budget = budget
        self.entries: OrderedDict[tuple, Inputs | RefResult] = OrderedDict()
        self.made = {"inputs": 0, "reference": 0}  # how often each had to be computed
        self.properties: dict[tuple, dict] = {}  # inputs_key -> the in_* columns (small)

    @property
    def held_bytes(self) -> int:
        return sum(_nbytes(v) for v in self.entries.values())

    def keep_only(self, cases: list[Case]) -> None:
        """Before a group: evict what it does not use, oldest first, until what is held
        fits the budget (a group's own entries are never evicted for it)."""
        if not cases:
            return
        budget = self.budget if self.budget is not None else budget_bytes(cases[0].device)
        wanted = {("inputs", inputs_key(c)) for c in cases} | {
            ("reference", reference_key(c)) for c in cases}
        held = self.held_bytes
        for key in list(self.entries):
            if held <= budget:
                break
            if key not in wanted:
                held -= _nbytes(self.entries.pop(key))

    def _get(self, key: tuple):
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def _put(self, key: tuple, value) -> None:
        self.entries[key] = value
        self.entries.move_to_end(key)
        self.made[key[0]] += 1

    def inputs_for(self, case: Case) -> Inputs:
        key = ("inputs", inputs_key(case))
        have = self._get(key)
        if have is None or (case.needs_grad and have.grad_out is None):
            # q, k, v are drawn before grad_out, so they are the same values either way
            have = case.make_inputs()
            self._put(key, have)
        return have if case.needs_grad else dataclasses.replace(have, grad_out=None)

    def properties_for(self, case: Case) -> dict:
        """The measured properties of the case's inputs (core/inputs_properties.py)."""
        key = (inputs_key(case), case.softmax_scale)
        if key not in self.properties:
            x = self.inputs_for(case)
            self.properties[key] = inputs_properties.properties(x.q, x.k, case.softmax_scale)
        return self.properties[key]

    def reference_for(self, case: Case) -> RefResult:
        key = ("reference", reference_key(case))
        have = self._get(key)
        if have is None or (case.needs_grad and have.dq is None):
            have = case_reference(case, self.inputs_for(case))
            self._put(key, have)
        return have if case.needs_grad else RefResult(have.out)
