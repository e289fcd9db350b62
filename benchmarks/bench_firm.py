"""Time FIRM's server-side merge and its retention projection side by side on a synthetic layout, and
the client-side Fisher estimation (batched per-sequence gradients vs a plain per-sequence loop).

Default layout = the paper's WMDP adapter: down_proj of layers 5-7 of a 7B model, i.e. three float32
tensors of 14336 x 4096 (~235 MB each, ~700 MB per client copy). Task vectors are LoRA products
``s * B @ A`` (rank 16, s = 32/16); Fisher diagonals are squared Gaussians (heavy-tailed, like squared
gradients). The budget epsilon is 0.3 x the mean no-projection damage over retain clients and
tensors, the calibration of the paper's Table 8, so the projection is active.

Each stage runs ``--repeats`` times and the fastest run counts (the machine may be shared); merge and
projection runs alternate, so a change in the machine's load during the benchmark affects both alike.
Both run in this process with the same torch thread count. Times are process CPU seconds
(``--clock wall`` for wall-clock), so other processes' load distorts them less (memory-bound code such as
the projection still slows down when other processes compete for memory bandwidth).

    python benchmarks/bench_firm.py --quick                  # 3 x 1024 x 256, seconds on a CPU
    python benchmarks/bench_firm.py --shape 4096 1024        # medium
    python benchmarks/bench_firm.py                          # full size (~6 GB of memory)
    python benchmarks/bench_firm.py --quick --fisher         # also: Fisher time per batch, tiny model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strategies.firm.maths import firm_merge  # noqa: E402
from strategies.firm.projection import firm_project_all, proxy_damage  # noqa: E402

FULL_SHAPE = (14336, 4096)
QUICK_SHAPE = (1024, 256)
LORA_RANK = 16
LORA_SCALE = 32 / 16


def synthetic_upload(shapes: dict[str, tuple[int, int]], generator: torch.Generator, device: torch.device):
    """One client's (task vector, raw Fisher) on the layout."""
    task_vector, fisher = {}, {}
    for name, (rows, cols) in shapes.items():
        b = 0.01 * torch.randn(rows, LORA_RANK, generator=generator, device=device)
        a = 0.01 * torch.randn(LORA_RANK, cols, generator=generator, device=device)
        task_vector[name] = LORA_SCALE * (b @ a)
        fisher[name] = torch.randn(rows, cols, generator=generator, device=device).square_().mul_(1e-6)
    return task_vector, fisher


def timed(fn, device: torch.device, repeats: int, clock):
    """``(result of the last run, fastest time)`` over ``repeats`` runs of ``fn``."""
    best, result = float("inf"), None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = clock()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, clock() - start)
    return result, best


def bench_merge_and_projection(args, device: torch.device, clock) -> None:
    shape = tuple(args.shape) if args.shape else (QUICK_SHAPE if args.quick else FULL_SHAPE)
    shapes = {f"model.layers.{i}.mlp.down_proj": shape for i in (5, 6, 7)}
    generator = torch.Generator(device=device).manual_seed(args.seed)
    forget = [synthetic_upload(shapes, generator, device) for _ in range(args.forget_clients)]
    retain = [synthetic_upload(shapes, generator, device) for _ in range(args.retain_clients)]

    def merge():
        return firm_merge(
            [tv for tv, _ in forget], [f for _, f in forget], ["forget"] * len(forget),
            [tv for tv, _ in retain], [f for _, f in retain], args.gamma, args.alpha, args.eps0,
        )

    merge_s = project_s = float("inf")
    epsilon = None
    for _ in range(args.repeats):  # alternating, fastest of each
        (base, constraints), seconds = timed(merge, device, 1, clock)
        merge_s = min(merge_s, seconds)
        if epsilon is None:
            damages = [proxy_damage(base[n], f) for n in base for f in constraints[n]]
            epsilon = 0.3 * sum(damages) / len(damages)
        project = lambda b=base, c=constraints: firm_project_all(b, c, epsilon, overwrite=True)  # as FIRM.aggregate does
        (projected, reports), seconds = timed(project, device, 1, clock)
        project_s = min(project_s, seconds)
        del projected, base, constraints

    name = device.type if device.type != "cuda" else f"cuda ({torch.cuda.get_device_name(device)})"
    print(f"device: {name}; torch threads: {torch.get_num_threads()}; clock: {args.clock}; best of {args.repeats}")
    clients = f"{args.forget_clients} forget + {args.retain_clients} retain clients"
    print(f"layout: {len(shapes)} x {shape} float32, {clients}")
    print(f"epsilon: {epsilon:.3e} (0.3 x mean no-projection damage)")
    print(f"merge:      {merge_s:9.3f} s")
    print(f"projection: {project_s:9.3f} s  (m = {args.retain_clients})")
    print(f"ratio projection/merge: {project_s / merge_s:.3f} (bar: <= 0.10)")
    worst = max(r.residuals.worst() for r in reports.values())
    print(f"worst KKT residual: {worst:.2e}; iterations per tensor: {[r.iterations for r in reports.values()]}")
    print(f"multipliers per tensor: {[[f'{v:.3g}' for v in r.lambdas] for r in reports.values()]}")


def bench_fisher(args, device: torch.device, clock) -> None:
    """Fisher time per batch (one sequence = one Fisher batch, paper App. C) on the tiny model."""
    from strategies.firm.fisher import diagonal_fisher, per_sample_fisher_loop
    from tasks.llm.model import build_llm
    from tasks.llm.synthetic import fictitious_authors
    from tasks.llm.train import qa_batches

    model, tokenizer = build_llm("tiny", seed=args.seed)
    model.to(device)
    batches = qa_batches(fictitious_authors(4, 20, seed=args.seed), tokenizer, batch_size=8, seed=args.seed)
    n = args.fisher_batches
    batched, batched_s = timed(lambda: diagonal_fisher(model, batches, num_batches=n), device, args.repeats, clock)
    looped, loop_s = timed(lambda: per_sample_fisher_loop(model, batches, num_batches=n), device, args.repeats, clock)
    gap = max(float((batched[k] - looped[k]).detach().abs().max() / looped[k].detach().abs().max().clamp(min=1e-30))
              for k in looped)
    print(f"fisher (tiny model, {len(looped)} adapted weights, {n} batches of one sequence):")
    print(f"  batched per-sequence gradients: {1e3 * batched_s / n:8.2f} ms per batch")
    print(f"  plain per-sequence loop:        {1e3 * loop_s / n:8.2f} ms per batch")
    print(f"  speed-up {loop_s / batched_s:.2f}x; max relative difference {gap:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"small layout: 3 tensors of {QUICK_SHAPE}")
    parser.add_argument("--shape", type=int, nargs=2, metavar=("ROWS", "COLS"), help="tensor shape (overrides --quick)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--forget-clients", type=int, default=1)
    parser.add_argument("--retain-clients", type=int, default=2, help="m, the constraints per tensor")
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--eps0", type=float, default=1e-8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per stage; the fastest counts")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="process CPU time or wall clock")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--fisher", action="store_true", help="also time the Fisher estimation on the tiny model")
    parser.add_argument("--fisher-batches", type=int, default=20)
    args = parser.parse_args()
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    clock = time.process_time if args.clock == "cpu" and device.type == "cpu" else time.perf_counter
    bench_merge_and_projection(args, device, clock)
    if args.fisher:
        bench_fisher(args, device, clock)


if __name__ == "__main__":
    main()
