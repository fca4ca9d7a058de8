"""A training step of the encoder from PyTorch, as the host sees it: ``GPT2Embedding`` against ``nn.Embedding``.

    python scripts/torch_step_timing.py [--batch-sizes 1 8 64] [--ids real] [--repeats 60] [--profile]

Times the bench's ``step`` cases (``gpt2enc_edu.bench.cases``: forward + backward into fresh gradients, host-timed
around synchronised calls, the four in turn as the bench times them) at GPT-2's shape, and the GPU time of the
CUDA-graph replay of the adapter's step (the bench's GPU timer: CUDA events, L2 flushed first), so that the replay's
host time can be read against it. Prints one table; ``--profile`` adds where the host time of the eager adapter
step goes (cProfile, the largest B). Needs CuPy, a GPU and a CUDA build of torch. The committed numbers come from
``python -m gpt2enc_edu.bench``, which times the same cases at every B.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from gpt2enc_edu.bench import cases, run
from gpt2enc_edu.bench.timer import summarize

STEPS = ("torch_step", "torch_step_det", "adapter_step", "adapter_step_graph")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--ids", nargs="+", default=["real"], choices=cases.ID_KINDS)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    import cupy as cp

    config = run.BenchConfig(batch_sizes=tuple(args.batch_sizes), kinds=tuple(args.ids), cases=STEPS,
                             repeats=args.repeats, warmup=args.warmup)
    torch, note = run.torch_status(True)
    if torch is None:
        raise SystemExit(f"PyTorch with CUDA is needed: {note}")
    session = run.start_session(cp, config, torch, note)
    print(f"{torch.cuda.get_device_name()}, {note}; host-timed medians of {args.repeats} (us)")
    print("| ids | B | " + " | ".join(STEPS) + " | graph replay, GPU | replay host / GPU |")
    print("|---" * (len(STEPS) + 4) + "|")
    steps = [cases.CASES_BY_NAME[name] for name in STEPS]
    for kind in args.ids:
        for B in args.batch_sizes:
            gpu = []

            def time_the_replay(timed: dict) -> None:  # on the GPU's clock, while the captured graph still lives
                replay = timed["adapter_step_graph"]
                gpu.extend(session.timer.time(replay.fn, replay.stream, warmup=args.warmup, repeats=args.repeats)[0])

            rows, failures = run.time_steps(session, config, steps, run.make_workload(session, config, kind, B),
                                            while_live=time_the_replay)
            if failures:
                raise SystemExit(f"ids={kind}, B={B}: " + "; ".join(f"{f['case']}: {f['error']}" for f in failures))
            medians = {r["case"]: r["median_us"] for r in rows}
            medians["gpu"] = summarize(gpu).median * 1e6
            cells = [f"{medians[n]:.1f}" for n in STEPS]
            ratio = medians["adapter_step_graph"] / medians["gpu"]
            print(f"| {kind} | {B} | " + " | ".join(cells) + f" | {medians['gpu']:.1f} | {ratio:.2f} |")
    if args.profile:
        w = run.make_workload(session, config, args.ids[0], max(args.batch_sizes))
        timed = cases.CASES_BY_NAME["adapter_step"].setup(w)
        for _ in range(args.warmup):
            timed.fn()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.repeats):
            timed.fn()
        torch.cuda.synchronize()
        profile.disable()
        timed.teardown()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())


if __name__ == "__main__":
    main()
