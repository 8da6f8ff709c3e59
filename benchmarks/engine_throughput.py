"""Embedded engine tokens/s at batch 1 and 8 and the batching gain (tiny model by default).

    python benchmarks/engine_throughput.py [--model-path DIR] [--batch-sizes 1 8] [--json]

Prints figures, not pass/fail. The measurement itself lives in
``gyre_env.engines.throughput`` so the proxy benchmark can reuse it.
"""

from __future__ import annotations

import argparse
import json

from gyre_env.engines.throughput import measure_embedded_throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="HF model folder (default: tiny model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = measure_embedded_throughput(
        args.model_path,
        batch_sizes=tuple(args.batch_sizes),
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
    )
    print(json.dumps(result.to_dict()) if args.json else result.summary())


if __name__ == "__main__":
    main()
