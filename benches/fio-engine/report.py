#!/usr/bin/env python3
"""Tables of benches/fio-engine/compare.sh from fio's JSON results.

    report.py RESULTS_DIR --command CMD --context TEXT > fio-on-plugio.md

Each result is RESULTS_DIR/TARGET__WORKLOAD__ENGINE__rN.json (fio's JSON)
with the run's stderr beside it (.stderr: plugio's iostats line from
plugio_stats=1). Cells are the median of the repeats, with min-max. CPU per
IO is fio's usr+sys CPU of the job (its process, io_uring workers
included) over the job's runtime, divided by the IOs it completed.
"""

import argparse
import glob
import json
import os
import re
import statistics
from collections import defaultdict

TARGETS = ["cache", "zram", "loop"]
WORKLOADS = [("randread", "4 KiB random reads, QD128"), ("seqread", "sequential 4 KiB reads, QD32")]
ENGINES = ["io_uring", "plugio", "plugio-nomerges"]
GOALS = {"randread": 1.0, "seqread": 1.2}


def si(x):
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.0f}K"
    return f"{x:.0f}"


def load(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = text.find("{")
    if start < 0:
        return None
    job = json.loads(text[start:])["jobs"][0]
    if job["error"]:
        return None
    ios = job["read"]["total_ios"]
    runtime_ms = job["job_runtime"]
    cpu_us = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime_ms * 1000.0
    stats = {}
    out = path[: -len(".json")] + ".stderr"
    if os.path.exists(out):
        with open(out, encoding="utf-8", errors="replace") as f:
            m = re.search(r"\(([0-9.]+) bios/request\)", f.read())
            if m:
                stats["bios_per_request"] = float(m.group(1))
    return {
        "iops": job["read"]["iops"],
        "cpu_us_per_io": cpu_us / ios if ios else float("nan"),
        **stats,
    }


def cell(values, fmt=si):
    if not values:
        return "—"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt(med)
    return f"{fmt(med)} ({fmt(min(values))}–{fmt(max(values))})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--command", required=True)
    ap.add_argument("--context", required=True)
    args = ap.parse_args()
    runs = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(args.results, "*.json"))):
        name = os.path.basename(path)[: -len(".json")]
        target, workload, engine, _rep = name.split("__")
        r = load(path)
        if r:
            runs[(target, workload, engine)].append(r)
    targets = [t for t in TARGETS if any(k[0] == t for k in runs)]
    print(f"Reproduce with `{args.command}`. {args.context}")
    print()
    print("Each cell: median of the repeats (min–max). `cache` = a file on disk read")
    print("through the page cache (direct=0), `zram` = a zram device (O_DIRECT), `loop`")
    print("= a loop device over a file in /dev/shm (O_DIRECT). fio's io_uring engine")
    print("with fixedbufs=1, registerfiles=1, hipri off; both engines with")
    print("iodepth_batch_submit = iodepth_batch_complete_min = min(QD, 32).")
    ratios = {}
    for workload, title in WORKLOADS:
        engines = [e for e in ENGINES if any(k[1] == workload and k[2] == e for k in runs)]
        print()
        print(f"#### {title}")
        print()
        head = ["target"] + [f"{e} IOPS" for e in engines] + ["plugio / io_uring"]
        head += [f"{e} CPU µs/IO" for e in engines] + ["plugio bios/request"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for t in targets:
            row = [t]
            iops = {e: [r["iops"] for r in runs.get((t, workload, e), [])] for e in engines}
            for e in engines:
                row.append(cell(iops[e]))
            if iops.get("io_uring") and iops.get("plugio"):
                ratio = statistics.median(iops["plugio"]) / statistics.median(iops["io_uring"])
                ratios[(t, workload)] = ratio
                row.append(f"{ratio:.2f}×")
            else:
                row.append("—")
            for e in engines:
                cpu = [r["cpu_us_per_io"] for r in runs.get((t, workload, e), [])]
                row.append(cell(cpu, lambda x: f"{x:.2f}"))
            bpr = [r["bios_per_request"] for r in runs.get((t, workload, "plugio"), []) if "bios_per_request" in r]
            row.append(cell(bpr, lambda x: f"{x:.1f}"))
            print("| " + " | ".join(row) + " |")
    print()
    print("#### Goals (ratio of medians in this run)")
    print()
    print("| goal | target | measured | status |")
    print("|---|---|---|---|")
    for workload, title in WORKLOADS:
        goal = GOALS[workload]
        for t in targets:
            if (t, workload) not in ratios:
                continue
            r = ratios[(t, workload)]
            status = "met" if r >= goal else f"**missed** by {(goal - r) / goal * 100:.0f} %"
            print(f"| plugio ≥ {goal:.1f}× io_uring, {title} | {t} | {r:.2f}× | {status} |")


if __name__ == "__main__":
    main()
