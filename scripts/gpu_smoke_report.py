"""Replays gpumem's JSON trace to the moments torch recorded and prints both
views side by side: reserved (gpumem's live bytes) against
memory_reserved(), allocated (PyTorch's USDT probes, tensor_alloc and
tensor_free events) against memory_allocated().
Usage: gpu_smoke_report.py TRACE.jsonl TORCH.json
       gpu_smoke_report.py --leaks LEAKS.json TORCH.json   (the leak's Python line)"""
import json
import sys

MIB = 1 << 20


def main(trace_path, torch_path):
    events = []
    summary = None
    with open(trace_path) as f:
        for line in f:
            v = json.loads(line)
            if v["type"] == "summary":
                summary = v
            else:
                events.append(v)
    snaps = json.load(open(torch_path))["snapshots"]
    pid = snaps[0]["pid"]
    counts = {}
    for e in events:
        if e["pid"] == pid:
            counts[e["api"]] = counts.get(e["api"], 0) + 1
    print("  calls seen:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
    ok = any(e["pid"] == pid and e["type"] in ("alloc", "vmm_create") and e["result"] == 0 for e in events)
    tensors_seen = any(e["pid"] == pid and e["type"] == "tensor_alloc" for e in events)
    if not tensors_seen:
        print("  no tensor_alloc events: PyTorch's USDT probes not attached or not built in (see gpumem status)")
    for snap in snaps:
        live = 0
        reserved_va = 0
        allocated = 0
        for e in events:
            if e["pid"] != pid or e["ts_ns"] > snap["ts_ns"] or e["result"] != 0:
                continue
            if e["type"] in ("alloc", "vmm_create"):
                live += e["size"]
            elif e["type"] == "free":
                live -= e["size"]
            elif e["type"] == "va_reserve":
                reserved_va += e["size"]
            elif e["type"] == "va_free":
                reserved_va -= e["size"]
            elif e["type"] == "tensor_alloc":
                allocated += e["size"]
            elif e["type"] == "tensor_free":
                allocated -= e["size"]
            for r in e.get("released", []):
                live -= r["bytes"]
        print(
            f"  {snap['label']:<11} gpumem live {live / MIB:10.1f} MiB"
            f" | torch reserved {snap['memory_reserved'] / MIB:10.1f} MiB"
            f" allocated {snap['memory_allocated'] / MIB:10.1f} MiB"
            f" | VA reserved (not memory) {reserved_va / MIB:10.1f} MiB"
        )
        if tensors_seen:
            # torch counts blocks (sizes rounded up to 512 B, unsplit remainders): gpumem's figure is at most it.
            gap = snap["memory_allocated"] - allocated
            verdict = "ok" if 0 <= gap < 16 * MIB else "MISMATCH"
            print(f"  {'':<11} gpumem allocated {allocated / MIB:10.1f} MiB | torch allocated minus gpumem's: {gap} B {verdict}")
    lost = summary["lost_events"] if summary else "no summary"
    print(f"  lost events: {lost}")
    if not ok:
        print("  gpumem saw no successful allocation from the PyTorch process", file=sys.stderr)
        return 1
    return 0


def leaks(leaks_path, torch_path):
    report = json.load(open(leaks_path))
    leak = json.load(open(torch_path))["leak"]
    pid = json.load(open(torch_path))["snapshots"][0]["pid"]
    for p in report["processes"]:
        if p["pid"] != pid or not p.get("tensors"):
            continue
        for g in p["tensors"]["stacks"]:
            py = [f for f in g["frames"] if f.get("python")]
            if any(f["function"] == leak["function"] and f.get("line") == leak["line"] for f in py):
                names = " <- ".join(f"{f['function']} ({(f.get('file') or '?').rsplit('/', 1)[-1]}:{f.get('line')})" for f in py[:4])
                print(f"  leak named: {g['count']} tensor(s), {g['bytes'] / MIB:.1f} MiB from {names}")
                return 0
    print(f"  the leak ({leak['function']} line {leak['line']}) is not in gpumem's tensor groups", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if sys.argv[1] == "--leaks":
        sys.exit(leaks(sys.argv[2], sys.argv[3]))
    sys.exit(main(sys.argv[1], sys.argv[2]))
