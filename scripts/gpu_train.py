"""Trains a small transformer for a few steps on random data and prints one JSON line:
peak reserved bytes, device memory used at the peak, median step time, and (with
``--allocator cubepool``) what cubepool's replay of the recorded run predicts.

One allocator per process (PyTorch fixes its allocator at the first CUDA allocation):
``default`` (PyTorch's caching allocator), ``expandable`` (the same with
``expandable_segments:True``, set in the environment by the caller) or ``cubepool``
(``cubepool.torch.use()``). Run by ``scripts/gpu-check``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--allocator", choices=["default", "expandable", "cubepool"], required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layout", default="default")
    args = parser.parse_args()

    run: Any = None
    if args.allocator == "cubepool":
        import cubepool.torch

        cubepool.torch.use(args.layout)

    import torch

    torch.manual_seed(0)
    vocab, d_model, seq, batch = 8192, 512, 256, 16
    layer = torch.nn.TransformerEncoderLayer(
        d_model, nhead=8, dim_feedforward=4 * d_model, batch_first=True
    )
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, d_model),
        torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False),
        torch.nn.Linear(d_model, vocab),
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    total = torch.cuda.mem_get_info()[1]

    def steps() -> tuple[list[float], int]:
        times: list[float] = []
        used_peak = 0
        for _ in range(args.steps):
            tokens = torch.randint(0, vocab, (batch, seq), device="cuda")
            targets = torch.randint(0, vocab, (batch, seq), device="cuda")
            torch.cuda.synchronize()
            start = time.perf_counter()
            logits = model(tokens)
            loss = loss_fn(logits.view(-1, vocab), targets.view(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            used_peak = max(used_peak, total - torch.cuda.mem_get_info()[0])
        return times, used_peak

    if args.allocator == "cubepool":
        import cubepool.torch

        with cubepool.torch.record(f"gpu-check-{args.layout}") as run:
            times, used_peak = steps()
        peak_reserved = cubepool.torch.memory_stats()["reserved_bytes.all.peak"]
        assert run.trace is not None
        predicted = cubepool.torch.predict(run.trace, args.layout).peak_reserved
        state = cubepool.torch.state()
    else:
        times, used_peak = steps()
        peak_reserved = torch.cuda.max_memory_reserved()
        predicted = None
        state = None
    print(
        json.dumps(
            {
                "allocator": args.allocator,
                "steps": args.steps,
                "peak_reserved": peak_reserved,
                "device_used_peak": used_peak,
                # The first steps warm up kernels and the allocator.
                "step_time_median_s": statistics.median(times[min(5, len(times) - 1) :]),
                "predicted_peak_reserved": predicted,
                "allocator_state": state,
            }
        )
    )


if __name__ == "__main__":
    main()
