"""triton_flash: our own FlashAttention-2 kernel in Triton, forward and backward.

The kernels live in ``_triton_flash_kernels.py`` (imported lazily, see below). This module is
the backend: capabilities, availability, and ``build``, which tunes the launch configurations
on the case's real inputs (on CUDA) so that autotuning never lands in a timed region.

On CPU the kernels run through the Triton interpreter, which Triton selects when the kernels
are *defined*: ``TRITON_INTERPRET=1`` must be in the environment before the kernel module is
first imported (importing ``triton`` earlier is harmless). That is why the kernel module is
imported on first use and not when the registry imports this file.

A paged cache (``page_size``) runs the split-KV decode kernel of ``_triton_paged.py``, which
reads the pool through the block table. A packed batch (``lengths``) runs the varlen kernels
of ``_triton_varlen.py`` over the rows in place, each document attending within itself.

Environment: ``ATTNBENCH_TRITON_FLASH_TUNE=0`` skips tuning (the first candidate of each
kernel runs); ``ATTNBENCH_TRITON_FLASH_TUNE_LOG=1`` prints every tuned candidate's time.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import torch

from attnbench.core.backend import Backend, Capabilities, Prepared, wrap_mode

CPU_REASON = ("triton_flash needs a CUDA GPU; set TRITON_INTERPRET=1 to run it through the "
              "Triton interpreter on CPU (slow)")
HEAD_DIM_MAX = 256
FP32_HEAD_DIM_MAX = 128


def _env_on(name: str, default: str = "0") -> bool:
    return os.environ.get(name, default).strip().lower() not in ("", "0", "false", "no")


def _kernels_module_name() -> str:
    pkg = __name__.rpartition(".")[0]
    return f"{pkg}._triton_flash_kernels" if pkg else "_triton_flash_kernels"


def meta():
    """Launch configurations and compiled-kernel metadata for records (_triton_flash_meta)."""
    return importlib.import_module(_kernels_module_name().replace("_kernels", "_meta"))


def kernels():
    """The kernel module, imported on first use (after TRITON_INTERPRET is known)."""
    return importlib.import_module(_kernels_module_name())


def interpreter_mode() -> bool:
    """Whether the kernels run through the Triton interpreter in this process.

    Once the kernel module is imported its mode is fixed; before that, the environment decides.
    """
    mod = sys.modules.get(_kernels_module_name())
    if mod is not None:
        return bool(mod.INTERPRET)
    return _env_on("TRITON_INTERPRET")


class TritonFlash(Backend):
    name = "triton_flash"
    code_modules = ("attnbench.implementations._triton_flash_kernels",
                    "attnbench.implementations._triton_paged",
                    "attnbench.implementations._triton_varlen")
    description = ("FlashAttention-2 written in Triton for this suite: fp32 online softmax "
                   "(exp2), recomputing backward, masked-block skipping, GQA without copies, "
                   "autotuned in build")
    caps = Capabilities(
        devices=("cpu", "cuda"),
        dtypes=("float32", "float16", "bfloat16"),
        masks=("none", "causal", "window"),
        head_dim_min=1,
        head_dim_max=HEAD_DIM_MAX,
        gqa=True,
        cross_attention=True,
        dv_differs=True,
        requires=("triton",),
        lengths=True,
        paged=True,
    )

    def is_available(self):
        ok, why = super().is_available()
        if not ok:
            return False, why
        if not torch.cuda.is_available() and not interpreter_mode():
            return False, CPU_REASON
        return True, ""

    def extra_reasons(self, case):
        out = []
        dev = torch.device(case.device).type
        if dev == "cpu" and not interpreter_mode():
            out.append(CPU_REASON)
        if dev == "cuda" and not torch.cuda.is_available():
            out.append("no CUDA device is present")
        if case.head_dim_v > HEAD_DIM_MAX:
            out.append(f"head_dim_v {case.head_dim_v} above {HEAD_DIM_MAX}")
        if case.dtype == "float32" and max(case.head_dim, case.head_dim_v) > FP32_HEAD_DIM_MAX:
            out.append(f"float32 with head dims above {FP32_HEAD_DIM_MAX} not supported "
                       f"(its tiles exceed one SM's shared memory)")
        return out

    # ---- computation ----------------------------------------------------
    def _plan(self, case):
        return kernels().make_plan(case.softmax_scale, case.mask_spec.window)

    def _tune(self, case, inputs, plan):
        K = kernels()
        if not _env_on("ATTNBENCH_TRITON_FLASH_TUNE", "1"):
            return {}, 0.0
        log = print if _env_on("ATTNBENCH_TRITON_FLASH_TUNE_LOG") else None
        grad_out = inputs.grad_out if case.needs_grad else None
        with torch.no_grad():
            return K.timed_tune(inputs.q, inputs.k, inputs.v, grad_out, plan, log)

    def build(self, case, inputs):
        if case.page_size:
            return self._paged(case, inputs)[0]
        if case.lengths:
            return self._varlen(case, inputs)[0]
        K = kernels()
        plan = self._plan(case)
        self._tune(case, inputs, plan)

        def triton_flash(q, k, v):
            return K.attention(q, k, v, plan)  # (B, Hq, Nq, Dv)

        return triton_flash

    def prepare(self, case, inputs) -> Prepared:
        if case.page_size:
            return self._prepare_paged(case, inputs)
        if case.lengths:
            return self._prepare_varlen(case, inputs)
        K = kernels()
        plan = self._plan(case)
        _, tune_s = self._tune(case, inputs, plan)
        q, k, v = inputs.q, inputs.k, inputs.v
        names = ["fwd", "dkdv", "dq"] if case.needs_grad else ["fwd"]
        configs = " ".join(f"{n}={K.config_for(n, q, k, v, plan)}" for n in names)
        mode = "interpreter" if K.INTERPRET else "compiled"

        def triton_flash(q, k, v):
            return K.attention(q, k, v, plan)  # (B, Hq, Nq, Dv)

        prepared = wrap_mode(triton_flash, case, inputs)
        M = meta()
        compiled = lambda: M.compiled_columns(K, names, q, k, v, plan)  # noqa: E731
        prepared.extras = {"kernel": f"triton_flash[{plan.kind}] {configs} ({mode})",
                           "compile_s": round(tune_s, 3),
                           **M.config_columns(K, names, q, k, v, plan),
                           # the GPU binary is read after the first call; the compile for
                           # sm_90 under the interpreter costs seconds: only when profiled
                           ("columns_when_profiled" if K.INTERPRET
                            else "columns_after_check"): compiled}
        return prepared

    def _sibling(self, name: str):
        """Another kernel module of this backend, imported after the dense one (which fixes
        interpreter or compiled for all of them)."""
        kernels()
        return importlib.import_module(_kernels_module_name().replace("_triton_flash_kernels",
                                                                      name))

    def _varlen(self, case, inputs):
        """(the packed kernels' f(q, k, v) over the case's rows in place, the kernel module,
        the packing, the plan, the tuning seconds)."""
        from attnbench.implementations._varlen import rows_of

        TV = self._sibling("_triton_varlen")
        packing = TV.Packing.of_rows(rows_of(case), case.seq_q)
        plan = TV.Plan(float(case.softmax_scale), case.mask == "causal")
        tune_s = 0.0
        if _env_on("ATTNBENCH_TRITON_FLASH_TUNE", "1"):
            log = print if _env_on("ATTNBENCH_TRITON_FLASH_TUNE_LOG") else None
            with torch.no_grad():
                _, tune_s = TV.timed_tune(inputs.q, inputs.k, inputs.v,
                                          inputs.grad_out if case.needs_grad else None,
                                          packing, plan, log)

        def triton_varlen(q, k, v):
            return TV.attention(q, k, v, packing, plan)  # (B, Hq, N, Dv)

        return triton_varlen, TV, packing, plan, tune_s

    def _prepare_varlen(self, case, inputs) -> Prepared:
        f, TV, packing, plan, tune_s = self._varlen(case, inputs)
        q, k, v = inputs.q, inputs.k, inputs.v
        names = ["fwd", "dkdv", "dq"] if case.needs_grad else ["fwd"]
        view = TV.bound(packing)
        configs = " ".join(f"{n}={view.config_for(n, q, k, v, plan)}" for n in names)
        mode = "interpreter" if TV.INTERPRET else "compiled"
        prepared = wrap_mode(f, case, inputs)
        M = meta()
        compiled = lambda: M.compiled_columns(view, names, q, k, v, plan)  # noqa: E731
        prepared.extras.update({
            "kernel": f"triton_flash[varlen-{plan.kind}] {configs} ({mode})",
            "compile_s": round(tune_s, 3),
            **M.config_columns(view, names, q, k, v, plan),
            ("columns_when_profiled" if TV.INTERPRET else "columns_after_check"): compiled})
        return prepared

    def _paged(self, case, inputs):
        """(the paged decode kernel's f(q, k, v) over the pool built at setup, which reads
        no k, v; the kernel module; the cache)."""
        TP = self._sibling("_triton_paged")
        from attnbench.implementations import _paged

        pc = _paged.setup(case, inputs)
        scale, causal = case.softmax_scale, case.mask == "causal"

        def triton_paged(q, k, v):
            return TP.paged_decode(q, pc.k_pool, pc.v_pool, pc.block_table, pc.context,
                                   scale, causal)  # (B, Hq, Nq, Dv)

        return triton_paged, TP, pc

    def _prepare_paged(self, case, inputs) -> Prepared:
        f, TP, pc = self._paged(case, inputs)
        prepared = wrap_mode(f, case, inputs)
        splits, per_split = TP.splits_for(pc.block_table.shape[1])
        mode = "interpreter" if TP.INTERPRET else "compiled"
        prepared.extras["kernel"] = (f"triton_flash[paged] splits={splits} "
                                     f"pages_per_split={per_split} ({mode})")
        return prepared


BACKENDS = [TritonFlash()]
