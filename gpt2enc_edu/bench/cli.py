"""The command line: ``python -m gpt2enc_edu.bench`` (and the ``gpt2enc-bench`` script).

    python -m gpt2enc_edu.bench                      # full run (a minute or two on an H200), writes docs/bench/
    python -m gpt2enc_edu.bench --quick              # B in {1, 64}, few repeats, writes docs/bench/quick/
    python -m gpt2enc_edu.bench --readme README.md   # ... and rewrites the README's table from this run
    python -m gpt2enc_edu.bench --from-results docs/bench --readme README.md   # no GPU: re-render a run's files
    python -m gpt2enc_edu.bench --readme README.md --readme-only   # no GPU: only the README's table, from docs/bench
    python -m gpt2enc_edu.bench --help

Without a GPU a measuring run says why, writes nothing and exits 0; ``--from-results`` and ``--readme-only`` need
no GPU.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from ..backend import gpu_status
from ..tokens import GPT2_VOCAB_SIZE
from ..validate import check_int
from .cases import C_GPT2, CASE_NAMES, ID_KINDS, T_GPT2
from .report import RESULTS_MD, Results, load_results, write_results
from .run import (
    BATCH_SIZES,
    DEFAULT_OUT,
    FULL_REPEATS,
    QUICK_BATCH_SIZES,
    QUICK_OUT,
    QUICK_REPEATS,
    BenchConfig,
    run_benchmark,
)
from .tables import markdown_report, replace_between_markers, update_readme


def int_at_least(minimum: int):
    """An argparse ``type``: an integer >= ``minimum`` (``validate.check_int``), else a usage error."""

    def parse(text: str) -> int:
        try:
            return check_int("the value", int(text), minimum=minimum)
        except ValueError as exc:  # int() of a non-number, or check_int's range
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r} ({exc})") from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpt2enc_edu.bench",
        description="Time the GPT-2 encoder kernels (and PyTorch) on the GPU against the memory floor "
                    f"(T={T_GPT2}, C={C_GPT2}, V={GPT2_VOCAB_SIZE}, bf16).")
    positive, nonnegative = int_at_least(1), int_at_least(0)
    parser.add_argument("--batch-sizes", type=positive, nargs="+", metavar="B",
                        help=f"batch sizes (default {' '.join(map(str, BATCH_SIZES))}; "
                             f"--quick: {' '.join(map(str, QUICK_BATCH_SIZES))})")
    parser.add_argument("--ids", nargs="+", choices=ID_KINDS, metavar="KIND",
                        help=f"token-id kinds, of {', '.join(ID_KINDS)} (default: all)")
    parser.add_argument("--cases", nargs="+", choices=CASE_NAMES, metavar="CASE",
                        help=f"what to time, of {', '.join(CASE_NAMES)} (default: all)")
    parser.add_argument("--repeats", type=positive,
                        help=f"timed GPU repeats per case (default {FULL_REPEATS[0]}; --quick: {QUICK_REPEATS[0]})")
    parser.add_argument("--warmup", type=nonnegative,
                        help=f"untimed calls first (default {FULL_REPEATS[1]}; --quick: {QUICK_REPEATS[1]})")
    parser.add_argument("--host-repeats", type=positive,
                        help=f"repeats of make_buckets on the host (default {FULL_REPEATS[2]}; "
                             f"--quick: {QUICK_REPEATS[2]})")
    parser.add_argument("--out", type=Path, help=f"output folder (default {DEFAULT_OUT}; --quick: {QUICK_OUT}; "
                                                 "--from-results: that folder)")
    parser.add_argument("--quick", action="store_true", help="smoke test: B in {1, 64}, few repeats")
    parser.add_argument("--no-torch", action="store_true", help="do not time PyTorch")
    parser.add_argument("--seed", type=nonnegative, default=0, help="seed of the inputs (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--readme", type=Path, metavar="FILE",
                        help="rewrite the table between FILE's <!-- bench-table:start/end --> markers from this run "
                             "(the largest B measured)")
    parser.add_argument("--from-results", type=Path, metavar="DIR",
                        help="measure nothing: read the run in DIR and write its report, plots (and --readme) again")
    parser.add_argument("--readme-only", action="store_true",
                        help=f"measure nothing and write nothing but the --readme table, from the run in "
                             f"--from-results (default {DEFAULT_OUT})")
    return parser


def config_from_args(args: argparse.Namespace) -> tuple[BenchConfig, Path]:
    """The run's configuration and output folder from parsed arguments (explicit options beat --quick)."""
    repeats, warmup, host_repeats = QUICK_REPEATS if args.quick else FULL_REPEATS
    config = BenchConfig(
        batch_sizes=tuple(args.batch_sizes or (QUICK_BATCH_SIZES if args.quick else BATCH_SIZES)),
        kinds=tuple(args.ids or ID_KINDS),
        cases=tuple(args.cases or CASE_NAMES),
        repeats=args.repeats or repeats,
        warmup=warmup if args.warmup is None else args.warmup,
        host_repeats=args.host_repeats or host_repeats,
        use_torch=not args.no_torch,
        seed=args.seed,
        quick=args.quick,
    )
    out = args.out if args.out is not None else (QUICK_OUT if args.quick else DEFAULT_OUT)
    return config, out


def _require(module: str, why: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise SystemExit(f"the benchmark needs {module} {why}: pip install {module} ({exc})") from None


def _finish(results: Results, out: Path, readme: Path | None) -> list[Path]:
    """Write the run's files (and the README's table); the paths written."""
    paths = write_results(results, out)
    if readme is not None:
        paths.append(update_readme(readme, results.rows, results.meta, results_md=out / RESULTS_MD))
    return paths


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status (0 also when there is no GPU: nothing to do)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.readme_only:
        if args.readme is None:
            parser.error("--readme-only needs --readme FILE")
        source = args.from_results or DEFAULT_OUT
        rows, meta = load_results(source)
        path = update_readme(args.readme, rows, meta, results_md=source / RESULTS_MD)
        print(f"rewrote the table in {path} from the run in {source}")
        return 0
    if args.from_results is not None:
        _require("matplotlib", "for its plots")
        rows, meta = load_results(args.from_results)
        paths = _finish(Results(rows, meta, list(meta.get("failures") or [])), args.out or args.from_results,
                        args.readme)
        print(f"rewrote {', '.join(str(p) for p in paths)} from the run in {args.from_results}")
        return 0
    config, out = config_from_args(args)
    status = gpu_status()
    if status.name != "cuda":
        print(f"No GPU: {status.reason}.\nThe benchmark times CUDA kernels, so nothing was measured and nothing "
              "was written. Committed results (if any) are in docs/bench/; notebooks/05_timings shows them.")
        return 0
    if not args.no_progress:
        _require("tqdm", "for its progress bar")
    _require("matplotlib", "for its plots")
    if args.readme is not None:  # before the run, not after it
        try:
            replace_between_markers(args.readme.read_text(), "")
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--readme {args.readme}: {exc}") from None
    command = " ".join(["python -m gpt2enc_edu.bench", *(sys.argv[1:] if argv is None else argv)])
    results = run_benchmark(config, progress=not args.no_progress, command=command)
    paths = _finish(results, out, args.readme)
    print(markdown_report(results.rows, results.meta))
    print(f"wrote {', '.join(str(p) for p in paths)} in {results.meta['elapsed_s']} s")
    if results.failures:
        print(f"{len(results.failures)} case(s) failed; see above and meta.json", file=sys.stderr)
        return 1
    return 0
