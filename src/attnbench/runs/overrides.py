"""Which (case, backend) pairs a command line selects: a suite with its axes overridden by
``--backends``, ``--dtype`` and ``--seq-len``, on a device. One definition, shared by
``attnbench run``/``profile`` and the pytest-benchmark plugin (benchmarks/conftest.py)."""

from __future__ import annotations

from attnbench.core.errors import BadInput


def csv_list(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def retry_statuses(text: str | None, resume: str | None) -> tuple[str, ...]:
    """The statuses ``--retry`` names (``run`` and ``model`` alike): only with ``--resume``,
    and never ``ok``."""
    from attnbench.core.record import STATUSES

    retry = tuple(csv_list(text) or ())
    if retry and not resume:
        raise BadInput("--retry: only with --resume RUN_ID")
    for status in retry:
        if status not in STATUSES or status == "ok":
            raise BadInput(f"--retry {status!r}: allowed: "
                           f"{', '.join(s for s in STATUSES if s != 'ok')}")
    return retry


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


def device_types(device: str | None) -> tuple[str, ...]:
    """The device types ``--device`` may run on, known without torch (``auto``: any of
    them); an unknown device is bad input."""
    from attnbench.runs.suite import DEVICE_TYPES

    if device in (None, "auto"):
        return DEVICE_TYPES
    kind = device.split(":")[0]
    if kind not in DEVICE_TYPES:
        raise BadInput(f"--device {device}: unknown device; allowed: auto, cpu, cuda, cuda:N")
    return (kind,)


def resolve_device(device: str | None) -> str:
    """``auto`` picks CUDA when present; asking for CUDA without a GPU is bad input."""
    if device_types(device) == ("cpu",):
        return device
    import torch  # only here: whether CUDA is present

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise BadInput(f"--device {device}: no CUDA device is present on this machine; "
                       f"allowed here: cpu, auto")
    return device


def read_selection(suite_name: str, backends: str | None = None, dtype: str | None = None,
                   seq_len: str | None = None, device: str | None = "auto", *,
                   suite_text: str | None = None):
    """(suite, settled): the first half of ``select``, which imports no backend and no torch.
    The suite has --dtype and --seq-len applied, and --backends when every name it gives is
    one the suite lists (``settled``: the suite then holds at least the pairs the run will
    have, so a plan too large is refused from its axes before torch loads). Backend names
    are not yet checked against the registry, nor the device resolved: both need every
    implementation imported, or torch (``finish_selection``)."""
    from attnbench.runs.suite import load_suite, narrow_backends, override_axes

    names = csv_list(backends)
    if names is not None and not names:
        raise BadInput("--backends '': allowed: comma-separated backend names, e.g. sdpa,naive")
    dtypes = csv_list(dtype)
    if dtypes is not None and not dtypes:
        raise BadInput("--dtype '': allowed: comma-separated dtypes, e.g. float32,bfloat16")
    device_types(device)
    suite = load_suite(suite_name, None, text=suite_text)
    override_axes(suite, dtype=dtypes, seq_len=positive_ints("--seq-len", seq_len))
    settled = names is None or set(names) <= set(suite.backends)
    if names is not None and settled:  # names the suite lists: narrowing loads no backend
        narrow_backends(suite, names, device)
    return suite, settled


def finish_selection(suite, backends: str | None = None, device: str | None = "auto",
                     expand: bool = True):
    """(suite, device, jobs) from what ``read_selection`` gave: every backend name (the
    command line's, then the suite's) checked against the registry, the device resolved,
    --backends applied (again: narrowing is idempotent)."""
    from attnbench.core.registry import all_backends
    from attnbench.runs.suite import narrow_backends

    known = sorted(all_backends())
    names = csv_list(backends)
    for b in names or []:
        if b not in known:
            raise BadInput(f"--backends: unknown backend {b!r}; allowed: {', '.join(known)}")
    suite.check_backends(known)
    device = resolve_device(device)
    narrow_backends(suite, names, device)
    return suite, device, suite.jobs_on(device) if expand else None


def select(suite_name: str, backends: str | None = None, dtype: str | None = None,
           seq_len: str | None = None, device: str | None = "auto", *,
           suite_text: str | None = None, expand: bool = True):
    """(suite, device, jobs) for the options as given on a command line (CSV strings);
    bad values raise BadInput naming the option and what is allowed. ``suite_text``: the
    TOML a run recorded (replayed instead of the file); ``expand=False``: jobs is None (the
    caller checks the plan's size from the axes first)."""
    suite, _ = read_selection(suite_name, backends, dtype, seq_len, device,
                              suite_text=suite_text)
    return finish_selection(suite, backends, device, expand)
