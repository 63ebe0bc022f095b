"""Which (case, backend) pairs a command line selects: a suite with its axes overridden by
``--backends``, ``--dtype`` and ``--seq-len``, on a device. One definition, shared by
``attnbench run``/``profile`` and the pytest-benchmark plugin (benchmarks/conftest.py)."""

from __future__ import annotations

from attnbench.core.errors import BadInput


def csv_list(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def positive_ints(option: str, text: str | None) -> list[int] | None:
    items = csv_list(text)
    if items is None:
        return None
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise BadInput(f"{option} {text!r}: give comma-separated positive integers, "
                       f"e.g. 512,1024") from None
    if not values or min(values) <= 0:
        raise BadInput(f"{option} {text!r}: sequence lengths must be positive integers")
    return values


def select(suite_name: str, backends: str | None = None, dtype: str | None = None,
           seq_len: str | None = None, device: str | None = "auto", *,
           suite_text: str | None = None, expand: bool = True):
    """(suite, device, jobs) for the options as given on a command line (CSV strings);
    bad values raise BadInput naming the option and what is allowed. ``suite_text``: the
    TOML a run recorded (replayed instead of the file); ``expand=False``: jobs is None (the
    caller checks the plan's size from the axes first)."""
    from attnbench.core.registry import all_backends
    from attnbench.runs.runner import resolve_device
    from attnbench.runs.suite import load_suite, narrow_backends, override_axes

    known = sorted(all_backends())
    names = csv_list(backends)
    if names is not None and not names:
        raise BadInput("--backends '': allowed: comma-separated backend names, e.g. sdpa,naive")
    for b in names or []:
        if b not in known:
            raise BadInput(f"--backends: unknown backend {b!r}; allowed: {', '.join(known)}")
    dtypes = csv_list(dtype)
    if dtypes is not None and not dtypes:
        raise BadInput("--dtype '': allowed: comma-separated dtypes, e.g. float32,bfloat16")
    device = resolve_device(device)
    suite = load_suite(suite_name, known, text=suite_text)
    override_axes(suite, dtype=dtypes, seq_len=positive_ints("--seq-len", seq_len))
    narrow_backends(suite, names, device)
    return suite, device, suite.jobs_on(device) if expand else None
