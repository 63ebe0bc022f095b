"""``attnbench build``: compile the native CPU kernels now, failed builds included."""

from __future__ import annotations

from attnbench.core.errors import BadInput


def add_parser(sub) -> None:
    b = sub.add_parser("build", help="build the native CPU kernels now (again where a "
                                     "build failed or was interrupted)")
    b.add_argument("kernels", nargs="*", metavar="KERNEL",
                   help="which kernels (default: all of them)")
    b.set_defaults(func=run)


def run(args) -> int:
    from attnbench.implementations import _native, _native_build

    names = args.kernels or list(_native.KERNELS)
    unknown = [n for n in names if n not in _native.KERNELS]
    if unknown:
        raise BadInput(f"build: unknown kernel {unknown[0]!r}; allowed: "
                       f"{', '.join(_native.KERNELS)}")
    why = _native._why_not()
    if why:
        print(f"native kernels not built: {why}; their backends run their eager paths")
        return 0
    problems = _native.prepare(names, retry=True)
    for name in names:
        if name in problems:
            print(f"{name}: {problems[name]}")
        else:
            print(f"{name}: built in {_native_build.folder(_native.spec(name))}")
    return 1 if problems else 0
