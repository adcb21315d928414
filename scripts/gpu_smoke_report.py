"""Replays gpumem's JSON trace to the moments torch recorded and prints both
views side by side. Usage: gpu_smoke_report.py TRACE.jsonl TORCH.json"""
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
    for snap in snaps:
        live = 0
        reserved_va = 0
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
            for r in e.get("released", []):
                live -= r["bytes"]
        print(
            f"  {snap['label']:<11} gpumem live {live / MIB:10.1f} MiB"
            f" | torch reserved {snap['memory_reserved'] / MIB:10.1f} MiB"
            f" allocated {snap['memory_allocated'] / MIB:10.1f} MiB"
            f" | VA reserved (not memory) {reserved_va / MIB:10.1f} MiB"
        )
    lost = summary["lost_events"] if summary else "no summary"
    print(f"  lost events: {lost}")
    if not ok:
        print("  gpumem saw no successful allocation from the PyTorch process", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
