"""PyTorch workload for scripts/gpu-smoke.sh: allocates, frees some, keeps
ten 2 MiB tensors from one line of leak_step (the leak gpumem must name), and
records torch's own view at the peak with a CLOCK_MONOTONIC timestamp (the
clock of gpumem's ts_ns), written as JSON to $GPUMEM_SMOKE_OUT with the
leak's file and line."""
import inspect
import json
import os
import time

import torch

MIB = 1 << 20


def snapshot(label):
    torch.cuda.synchronize()
    return {
        "label": label,
        "ts_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
        "pid": os.getpid(),
        "device": torch.cuda.current_device(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "memory_allocated": torch.cuda.memory_allocated(),
    }


def leak_step(kept):
    kept.append(torch.empty(2 * MIB, dtype=torch.uint8, device="cuda"))


LEAK_LINE = inspect.getsourcelines(leak_step)[1] + 1


def main():
    dev = torch.device("cuda")
    kept = []
    for _ in range(10):
        leak_step(kept)
    big = [torch.empty(256 * MIB, dtype=torch.uint8, device=dev) for _ in range(4)]
    small = [torch.empty(3 * MIB + i * 4096, dtype=torch.uint8, device=dev) for i in range(32)]
    peak = snapshot("peak")
    del big[::2]
    del small[::2]
    torch.cuda.empty_cache()
    after = snapshot("after_free")
    with open(os.environ["GPUMEM_SMOKE_OUT"], "w") as f:
        json.dump({"snapshots": [peak, after], "leak": {"function": "leak_step", "file": __file__, "line": LEAK_LINE}}, f)
    # Held so that `gpumem leaks` reports while the tensors are alive.
    time.sleep(float(os.environ.get("GPUMEM_SMOKE_HOLD", "0.2")))


if __name__ == "__main__":
    main()
