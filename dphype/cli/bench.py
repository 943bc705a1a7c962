"""``dphype bench``: measure ``k`` on your own task before a federation votes; the paper's benchmarks.

``dphype bench ksweep --proxy DATA`` runs from any folder: it builds your app's task (the ``Task`` of its ClientApp
module, named by its ``pyproject.toml``, or ``--task module:callable``) on the rows of a public proxy data set split
into simulated clients, and replays the winner release for every ``k`` (`dphype.ml.ksweep`): which ``k`` lands
nearest Opt on data like yours, and where the default ballot's ``k`` lands. The candidates are the app's (the
``candidates`` of its ServerApp module) or ``--candidates``.

Every other ``dphype bench STUDY ...`` (and ``ksweep`` without ``--proxy``) is one of the paper's benchmark studies:
``python -m simulations STUDY ...``, a program of a dphype repository checkout run in a child process
(`paper_study`); outside a checkout it is refused in one line before any work.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dphype.checks import NEIGHBOURING

#: What ``dphype bench --help`` says of the paper's studies (their list: ``python -m simulations --help``).
STUDIES_HELP = ("STUDY ...: one of the paper's benchmark studies (tradeoff, synthetic, ksweep without --proxy, ...), "
                "run from the root of a dphype repository checkout (python -m simulations --help lists them)")


def paper_study(argv: Sequence[str]) -> list[str] | None:
    """The arguments of ``python -m simulations`` when ``dphype bench ARGV`` names one of the paper's studies.

    Args:
        argv: The arguments after ``bench``.

    Returns:
        ``argv`` for a study (any first argument but ``ksweep`` and the help options; ``ksweep`` without ``--proxy``
        and without a help option), ``None`` for what this module runs (``ksweep --proxy``, ``--help``).
    """
    if not argv or argv[0].startswith("-"):
        return None
    if argv[0] != "ksweep":
        return list(argv)
    ours = any(a in ("-h", "--help") or a == "--proxy" or a.startswith("--proxy=") for a in argv[1:])
    return None if ours else list(argv)


def refuse_outside_checkout(argv: Sequence[str]) -> str:
    """The one line that refuses a paper study outside a repository checkout (its first argument names it).

    Args:
        argv: The study's arguments.

    Returns:
        The line.
    """
    if argv[0] == "ksweep":
        return "ksweep needs --proxy DATA (public data like yours); the paper's ksweep runs in a dphype checkout"
    return f"{argv[0]!r}: the paper's studies run in a dphype repository checkout (its root); here only ksweep"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``dphype bench ksweep`` (the paper's studies are dispatched before parsing, `paper_study`).

    Args:
        parser: The sub-command's parser.
    """
    parser.description = ("Measure k on your own task before a federation votes (ksweep, from any folder), or run "
                          f"the paper's benchmarks. {STUDIES_HELP}.")
    sub = parser.add_subparsers(dest="study", required=True, metavar="ksweep | STUDY ...")
    ksweep = sub.add_parser(
        "ksweep", help="the winner release's k measured on your app's Task over a public proxy data set (any folder)",
        description="Measure the argmax release's k on your own task: a public proxy data set like your clients' "
                    "data, split into simulated clients that each build your Task on their rows (Task(x, y)) and "
                    "score the candidates; the winner release replayed at every k on the same noise. In a dphype "
                    "repository checkout, ksweep without --proxy runs the paper's study (python -m simulations "
                    "ksweep --help).")
    ksweep.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ksweep.add_argument("--proxy", required=True, metavar="DATA",
                        help="the public proxy data set: a registered one (adult, mnist5k, breast-cancer, digits, "
                             "fair, randhie, ...) or a CSV file with a header row and the label last")
    ksweep.add_argument("--data-dir", default=None, help="the folder of a proxy that is not bundled (e.g. mnist)")
    ksweep.add_argument("--app", default=".", help="the app folder whose Task and candidates are used (default .)")
    ksweep.add_argument("--task", default=None, metavar="MODULE:NAME",
                        help="the task to build on each client's rows, called as NAME(x, y) (default: the Task of "
                             "the app's ClientApp module)")
    ksweep.add_argument("--candidates", default=None,
                        help="candidate spec: a .json list, table3, an integer N or table3:random:SIZE:SEED (default: "
                             "the candidates of the app's ServerApp module)")
    ksweep.add_argument("--clients", type=int, default=10, help="simulated clients n, at least 2 (default 10)")
    ksweep.add_argument("--partition", default="iid",
                        help="how the proxy is split: iid (default) or dirichlet:BETA (label skew, e.g. dirichlet:0.5)")
    ksweep.add_argument("--epsilon", type=float, nargs="+", default=[1.0], help="release epsilons (default 1)")
    ksweep.add_argument("--neighbouring", nargs="+", choices=NEIGHBOURING, default=["replace-one"],
                        help="neighbouring relations (default replace-one)")
    ksweep.add_argument("--ks", type=int, nargs="+", default=None,
                        help="votes per client to sweep (default every k below the number of candidates)")
    ksweep.add_argument("--repetitions", type=int, default=1000, help="winner releases per point (default 1000)")
    ksweep.add_argument("--tolerance", type=float, default=0.02,
                        help="a release is within it when its pick's score on the pooled rows is this close to the "
                             "best candidate's, in the task's score units (default 0.02)")
    ksweep.add_argument("--seed", type=int, default=0, help="seeds the split and the noise (default 0)")
    ksweep.add_argument("--out", default=None, metavar="FILE.csv", help="also write the sweep's rows to this CSV")


def _app_component(app: Path, name: str) -> str:
    """The module of the app's ``[tool.flwr.app.components]`` entry ``name`` (``clientapp``, ``serverapp``)."""
    path = app / "pyproject.toml"
    if not path.is_file():
        raise ValueError(f"--app {str(app)!r} holds no pyproject.toml: run it in your app's folder, or pass --task "
                         "and --candidates\n(dphype new writes an app folder; --task MODULE:NAME)")
    with path.open("rb") as fh:
        components = tomllib.load(fh).get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    if name not in components:
        raise ValueError(f"{path} names no [tool.flwr.app.components] {name}: pass "
                         f"{'--task MODULE:NAME' if name == 'clientapp' else '--candidates'}")
    return str(components[name]).split(":", 1)[0]


def _attribute(module: str, name: str, app: Path, option: str) -> Any:
    """``module.name``, imported with the app folder first on the import path; ``ValueError`` naming ``option``."""
    sys.path.insert(0, str(app))
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{option}: cannot load {name} from {module} ({err}); pass {option}") from None
    finally:
        sys.path.remove(str(app))
    return value


def task_factory(app: Path, spec: str | None) -> Any:
    """What builds a client's task: ``--task MODULE:NAME``, else the ``Task`` of the app's ClientApp module."""
    if spec is None:
        return _attribute(_app_component(app, "clientapp"), "Task", app, "--task MODULE:NAME")
    module, _, name = spec.partition(":")
    if not (module and name):
        raise ValueError(f"--task must be MODULE:NAME (e.g. my_app.client_app:Task), got {spec!r}")
    found = _attribute(module, name, app, "--task MODULE:NAME")
    if not callable(found):
        raise ValueError(f"--task {spec} is not callable: name a class or function called as NAME(x, y)")
    return found


def app_candidates(app: Path, spec: str | None) -> Any:
    """``--candidates SPEC``, else the ``candidates`` of the app's ServerApp module (a candidate list)."""
    # lazy import: start-up
    from dphype.selection.candidates import CandidateList, load_candidates

    if spec is not None:
        return load_candidates(spec)
    found = _attribute(_app_component(app, "serverapp"), "candidates", app, "--candidates")
    if not isinstance(found, CandidateList):
        raise ValueError("the app's ServerApp module's candidates is not a candidate list (dphype.candidate_grid); "
                         "pass --candidates")
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``dphype bench ksweep --proxy DATA``: the sweep on the app's task (`dphype.ml.ksweep.sweep`).

    Args:
        args: The parsed options.

    Returns:
        The sweep, with the ``task``, the ``proxy`` and the ``out`` file (when written).

    Raises:
        ValueError: For bad input, before any client scores a candidate.
    """  # noqa: DOC502
    # lazy import: torch-free, but numpy and the data loaders are not needed for --help
    from dphype.checks import check_int
    from dphype.ml.ksweep import Partition, load_proxy, sweep
    from dphype.strict_json import jsonable

    app = Path(args.app).expanduser().absolute()
    partition = Partition.parse(args.partition)
    check_int("clients", args.clients, 2)
    out = None if args.out is None else Path(args.out)
    if out is not None and out.suffix != ".csv":
        raise ValueError(f"--out must name a .csv file, got {args.out!r}")
    factory = task_factory(app, args.task)
    candidates = app_candidates(app, args.candidates)
    data = load_proxy(args.proxy, args.data_dir)
    result = sweep(factory, data, list(candidates), clients=args.clients, partition=partition, epsilons=args.epsilon,
                   neighbourings=args.neighbouring, ks=args.ks, repetitions=args.repetitions,
                   tolerance=args.tolerance, seed=args.seed)
    if out is not None:
        # lazy import: csv only when writing
        import csv

        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(result["rows"][0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(result["rows"])
    name = args.task or f"{_app_component(app, 'clientapp')}:Task"
    return jsonable({"task": name, "proxy": args.proxy, **result, "out": None if out is None else str(out)})


def render(result: dict[str, Any]) -> str:
    """The sweep as text: per epsilon and relation, the gap at every ``k`` and the best ``k`` against the default's."""
    lines = [f"{result['task']} on {result['proxy']}, {result['clients']} simulated clients ({result['partition']}), "
             f"{result['candidates']} candidates, {result['repetitions']} winner releases per point; the gap is in "
             f"the task's score units on the pooled rows (Opt: candidate {result['opt']}), within = share of releases "
             f"within {result['tolerance']:g}"]
    for best in result["best"]:
        eps, relation = best["epsilon"], best["neighbouring"]
        lines.append(f"epsilon {eps:g}, {relation}:")
        for row in result["rows"]:
            if (row["epsilon"], row["neighbouring"], row["ballot"]) == (eps, relation, "top-k"):
                marks = [mark for mark, on in (("best", row["k"] == best["best_k"]),
                                               ("the default ballot's", row["k"] == best["default_k"])) if on]
                lines.append(f"  k {row['k']:>3}: gap {row['gap']:.4g}, within {row['within']:.0%}"
                             + (f"  <- {', '.join(marks)}" if marks else ""))
        default = "" if best["default_k"] is None else f" (k {best['default_k']})"
        lines.append(f"  best k {best['best_k']} (gap {best['best_gap']:.4g}); the default ballot{default} trails it "
                     f"by {best['default_behind']:.4g}")
    if result["out"]:
        lines.append(f"rows written to {result['out']}")
    return "\n".join(lines)
