"""Time FIRM's server-side merge and its retention projection side by side on a synthetic layout.

Default layout = the paper's WMDP adapter: down_proj of layers 5-7 of a 7B model, i.e. three float32
tensors of 14336 x 4096 (~235 MB each, ~700 MB per client copy). Task vectors are LoRA products
``s * B @ A`` (rank 16, s = 32/16); Fisher diagonals are squared Gaussians (heavy-tailed, like squared
gradients). The budget epsilon is 0.3 x the mean no-projection damage over retain clients and
tensors, the calibration of the paper's Table 8, so the projection is active.

    python benchmarks/bench_firm.py --quick               # small layout, seconds on a CPU
    python benchmarks/bench_firm.py --device cuda         # full size (about 6 GB of host/device memory)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strategies.firm_math import firm_merge, firm_project_all, proxy_damage  # noqa: E402

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


def timed(fn, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"small layout: 3 tensors of {QUICK_SHAPE}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--forget-clients", type=int, default=1)
    parser.add_argument("--retain-clients", type=int, default=2, help="m, the constraints per tensor")
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--eps0", type=float, default=1e-8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device(args.device)
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    shapes = {f"model.layers.{i}.mlp.down_proj": shape for i in (5, 6, 7)}
    generator = torch.Generator(device=device).manual_seed(args.seed)
    forget = [synthetic_upload(shapes, generator, device) for _ in range(args.forget_clients)]
    retain = [synthetic_upload(shapes, generator, device) for _ in range(args.retain_clients)]

    (base, constraints), merge_s = timed(
        lambda: firm_merge(
            [tv for tv, _ in forget], [f for _, f in forget], ["forget"] * len(forget),
            [tv for tv, _ in retain], [f for _, f in retain], args.gamma, args.alpha, args.eps0,
        ),
        device,
    )
    damages = [proxy_damage(base[n], f) for n in base for f in constraints[n]]
    epsilon = 0.3 * sum(damages) / len(damages)
    (projected, reports), project_s = timed(lambda: firm_project_all(base, constraints, epsilon), device)

    name = device.type if device.type != "cuda" else f"cuda ({torch.cuda.get_device_name(device)})"
    print(f"device: {name}; torch threads: {torch.get_num_threads()}")
    print(f"layout: {len(shapes)} x {shape} float32, {args.forget_clients} forget + {args.retain_clients} retain clients")
    print(f"epsilon: {epsilon:.3e} (0.3 x mean no-projection damage)")
    print(f"merge:      {merge_s:9.3f} s")
    print(f"projection: {project_s:9.3f} s  (m = {args.retain_clients})")
    print(f"ratio projection/merge: {project_s / merge_s:.3f}")
    worst = max(r.residuals.worst() for r in reports.values())
    print(f"worst KKT residual: {worst:.2e}; iterations per tensor: {[r.iterations for r in reports.values()]}")
    print(f"multipliers per tensor: {[[f'{v:.3g}' for v in r.lambdas] for r in reports.values()]}")
    del projected


if __name__ == "__main__":
    main()
