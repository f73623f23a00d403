"""Launch one template kernel a few times, for a profiler to read (Nsight Compute).

    ncu --section SpeedOfLight --section WarpStateStats -k regex:epilab -c 3 \\
        python3 benchmarks/profile_kernel.py --shape 8192x4096x512 --epilogue bias_gelu \\
        --config '{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4,
                   "variant": "sm90_pingpong", "TMA_STORE": 1}'

bf16, nn.Linear layout (A [M, K], B = W.T). The launch is checked against float64 first (not
profiled: ``-k regex:epilab`` with ``-c`` counts the timed launches after it... and the check's
launch too, so ask for one more than you want).
"""

from __future__ import annotations

import argparse
import json

import torch

from epilab.ir.catalog import epilogue
from epilab.ir.config import Config
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import bind
from epilab.templates.verify import checked_launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, help="MxNxK")
    parser.add_argument("--epilogue", default="none")
    parser.add_argument("--config", required=True, help="a config as JSON")
    parser.add_argument("--launches", type=int, default=3)
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16).t()
    ep = epilogue(args.epilogue, "bfloat16")
    ops = {
        "bias": torch.randn(n, device="cuda").to(torch.bfloat16),
        "residual": torch.randn(m, n, device="cuda"),
    }
    operands = {name: ops[name].to(torch.bfloat16) for name, _ in ep.operands}
    problem = make_problem(a, b, ep, operands, op="addmm" if "bias" in args.epilogue else "mm")
    config = Config.from_dict(json.loads(args.config))
    checked_launch(problem, config, a, b, operands)
    bound = bind(problem, config, a, b, operands)
    for _ in range(args.launches):
        bound.run()
    torch.cuda.synchronize()
    print(f"{problem.shape} {args.epilogue} {config.short()}: {args.launches} launches")


if __name__ == "__main__":
    main()
