"""The bench room: time the encoder kernels on a GPU, next to PyTorch and next to the memory-bandwidth floor.

    python -m gpt2enc_edu.bench --help

Modules, each one concern (arrows point down the list; none imports the package's ``__init__``):

* ``perfdoc`` -- the tables of ``docs/performance.md`` (between markers), from a finished run
  (``python -m gpt2enc_edu.bench.perfdoc``);
* ``cli`` -- the command line (``main``);
* ``run`` -- ``BenchConfig``, ``run_benchmark``: the loop over (id kind, B) x cases, the run's metadata;
* ``report`` -- result rows, ``results.csv``, ``meta.json``, writing and loading a results folder;
* ``tables`` -- markdown: the report, the per-kernel breakdown, the README's table (between markers);
* ``plots`` -- time vs B, percent of the floor, achieved GB/s against the copy rate, the breakdown;
* ``cases`` -- what is timed: one named setup function per case (``CASES``);
* ``timer`` -- ``GpuTimer`` (CUDA events, cold L2, spin kernel ``kernels/bench_spin.cu``), the copy rate,
  host timing, ``summarize``;
* ``floor`` -- pure arithmetic: minimal bytes, the floor, percent of the floor, achieved bandwidth.

The names most used from outside are re-exported here (``from gpt2enc_edu import bench; bench.minimal_bytes``).
"""

from .cases import CASE_NAMES, CASES, CASES_BY_NAME, ID_KINDS, Case
from .cli import build_parser, config_from_args, main
from .floor import (
    ALL_OPS,
    OPS,
    achieved_bytes_per_s,
    copy_rate_of,
    distinct_ids,
    floor_seconds,
    minimal_bytes,
    percent_of_floor,
)
from .report import COLUMNS, Results, load_results, make_row, read_csv, write_csv, write_results
from .run import FULL_REPEATS, QUICK_REPEATS, BenchConfig, run_benchmark
from .tables import format_time_us, markdown_report, readme_block, update_readme
from .timer import GpuTimer, Summary, measure_copy_rate, summarize, time_make_buckets, time_synchronised_in_turn

__all__ = [
    "ALL_OPS", "CASES", "CASES_BY_NAME", "CASE_NAMES", "COLUMNS", "FULL_REPEATS", "ID_KINDS", "OPS", "QUICK_REPEATS",
    "BenchConfig", "Case", "GpuTimer", "Results", "Summary", "achieved_bytes_per_s", "build_parser",
    "config_from_args", "copy_rate_of", "distinct_ids", "floor_seconds", "format_time_us", "load_results", "main",
    "make_row", "markdown_report", "measure_copy_rate", "minimal_bytes", "percent_of_floor", "read_csv",
    "readme_block", "run_benchmark", "summarize", "time_make_buckets", "time_synchronised_in_turn", "update_readme",
    "write_csv", "write_results",
]
