#!/usr/bin/env python3
"""Side-by-side: SCALE-Sim 3.0.0 against day0's systolic-array model.

For every shape x dataflow in SHAPES x DATAFLOWS this script runs SCALE-Sim (installed into a
venv on first use: scalesim==3.0.0 with numpy<2 and pandas<3, which it needs) on a 128x128
array, reads its COMPUTE_REPORT.csv, runs `day0 kernel gemm --device systolic-128 --dataflow
DF --cost-only --json` on the same shape, and writes a Markdown table: shape, dataflow,
SCALE-Sim compute cycles, day0 compute cycles, whether they are equal, and both wall times.

SCALE-Sim's "Total Cycles" counts stalls too; with ample SRAM and `InterfaceBandwidth: CALC`
its stalls are zero, and the script records Total - Stall as its compute cycles (and fails
loudly if stalls appear). Its wall time is the whole `python -m scalesim.scale` process (trace
files off); day0's is the whole `day0` process, which also simulates the kernel's memory side.

Usage (from the repository root, after `cargo build --release`):

    python3 tools/calibrate/scalesim_compare.py            # all shapes, writes the table
    python3 tools/calibrate/scalesim_compare.py --quick    # small shapes only, no 1024^3
    python3 tools/calibrate/scalesim_compare.py --shape 1024x1024x1024 --dataflow os

Results are merged into the existing CSV (keyed by shape and dataflow) unless --fresh, so a
long run can be done in parts; the Markdown table is regenerated from the whole CSV.

The table goes to tools/calibrate/scalesim_table.md and, as data, to
tools/calibrate/scalesim_table.csv (read by tests/systolic_scalesim.rs).
"""

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARRAY = (128, 128)  # rows, cols: the [systolic] section of accel-sim/presets/systolic-128.toml
DATAFLOWS = ["os", "ws", "is"]
# (M, N, K): square, ragged (no side a multiple of 128), and skinny M = 1..64 decode-like shapes.
SHAPES = [
    (128, 128, 128),
    (256, 256, 256),
    (512, 512, 512),
    (100, 200, 300),
    (129, 257, 65),
    (300, 129, 1000),
    (1000, 1000, 1000),
    (1, 1024, 1024),
    (2, 2048, 512),
    (7, 130, 129),
    (16, 4096, 1024),
    (33, 1000, 777),
    (64, 7168, 512),
    (64, 2112, 1536),
    (1024, 1024, 1024),
]
QUICK = [s for s in SHAPES if s[0] * s[1] * s[2] <= 300 * 129 * 1000]

CONFIG = """[general]
run_name = day0

[architecture_presets]
ArrayHeight:    {rows}
ArrayWidth:     {cols}
IfmapSramSzkB:   8192
FilterSramSzkB:  8192
OfmapSramSzkB:   8192
IfmapOffset:    0
FilterOffset:   10000000
OfmapOffset:    20000000
Bandwidth : 10
Dataflow : {df}
MemoryBanks:   1
ReadRequestBuffer: 32
WriteRequestBuffer: 32

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: CALC
UseRamulatorTrace: False
"""

# SCALE-Sim 3.0.0 reads a layout file (`-l`) even when custom layouts are off; one row per layer.
LAYOUT = (
    "Layer name, IFMAP Height Intraline Factor, IFMAP Width Intraline Factor, Filter Height "
    "Intraline Factor, Filter Width Intraline Factor, Channel Intraline Factor, Num Filter "
    "Intraline Factor, IFMAP Height Intraline Order, IFMAP Width Intraline Order, Channel "
    "Intraline Order, IFMAP Height Interline Order, IFMAP Width Interline Order, Channel "
    "Interline Order, Num Filter Intraline Order, Channel Intraline Order, Filter Height "
    "Intraline Order, Filter Width Intraline Order, Num Filter Interline Order, Channel "
    "Interline Order, Filter Height Interline Order, Filter Width Interline Order,\n"
    "L0,1,1,1,1,1,1,1,2,0,4,5,3,3,0,1,2,7,4,5,6,\n"
)


def ensure_venv(venv: Path) -> Path:
    """Creates the venv with scalesim 3.0.0 on first use; returns its python."""
    py = venv / "bin" / "python"
    if py.exists():
        probe = subprocess.run([str(py), "-c", "import scalesim"], capture_output=True)
        if probe.returncode == 0:
            return py
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "scalesim==3.0.0", "numpy<2", "pandas<3"],
        check=True,
    )
    return py


def timed(cmd, **kw):
    """Runs `cmd`; returns (completed process, wall seconds, CPU seconds of the child).

    CPU time (user + system) is recorded beside wall time because the machine this ran on is
    shared: wall times there stretch with the load, CPU times much less."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p, wall, cpu


def run_scalesim(py: Path, work: Path, shape, df):
    """Runs SCALE-Sim on one GEMM; returns (compute cycles, wall seconds, CPU seconds)."""
    m, n, k = shape
    d = work / f"{m}x{n}x{k}_{df}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "cfg.cfg").write_text(CONFIG.format(rows=ARRAY[0], cols=ARRAY[1], df=df))
    (d / "topo.csv").write_text(f"Layer, M, N, K,\nL0, {m}, {n}, {k},\n")
    (d / "layout.csv").write_text(LAYOUT)
    cmd = [str(py), "-m", "scalesim.scale", "-c", "cfg.cfg", "-t", "topo.csv",
           "-l", "layout.csv", "-p", "out", "-i", "gemm", "-s", "N"]
    p, wall, cpu = timed(cmd, cwd=d)
    if p.returncode != 0:
        raise RuntimeError(f"SCALE-Sim failed on {shape} {df}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(d / "out" / "day0" / "COMPUTE_REPORT.csv") as f:
        rows = list(csv.reader(f))
    head = [h.strip() for h in rows[0]]
    vals = [v.strip() for v in rows[1]]
    total = int(float(vals[head.index("Total Cycles")]))
    stall = int(float(vals[head.index("Stall Cycles")]))
    if stall != 0:
        raise RuntimeError(f"SCALE-Sim stalled {stall} cycles on {shape} {df}: raise SRAM sizes")
    shutil.rmtree(d / "out", ignore_errors=True)
    return total - stall, wall, cpu


def run_day0(day0: Path, shape, df):
    """Runs day0 on one GEMM; returns (compute cycles, total with memory, wall s, CPU s)."""
    m, n, k = shape
    cmd = [str(day0), "kernel", "gemm", "--device", "systolic-128", "--dataflow", df,
           "--m", str(m), "--n", str(n), "--k", str(k), "--tile", "128x128x128",
           "--cost-only", "--json"]
    p, wall, cpu = timed(cmd)
    if p.returncode != 0:
        raise RuntimeError(f"day0 failed on {shape} {df}: {p.stderr}")
    v = json.loads(p.stdout)
    return v["compute_cycles"], v["total_cycles_with_memory"], wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    ap.add_argument("--venv", default=str(ROOT / "target" / "scalesim-venv"))
    ap.add_argument("--day0", default=str(ROOT / "target" / "release" / "day0"))
    ap.add_argument("--out", default=str(ROOT / "tools" / "calibrate" / "scalesim_table"))
    ap.add_argument("--shape", action="append", help="MxNxK (repeatable; default: the list)")
    ap.add_argument("--dataflow", action="append", choices=DATAFLOWS, help="repeatable")
    ap.add_argument("--fresh", action="store_true", help="replace the CSV instead of merging")
    args = ap.parse_args()
    day0 = Path(args.day0)
    if not day0.exists():
        sys.exit(f"{day0} not found: run `cargo build --release` first (or pass --day0)")
    py = ensure_venv(Path(args.venv))
    shapes = QUICK if args.quick else SHAPES
    if args.shape:
        shapes = [tuple(int(x) for x in sh.lower().split("x")) for sh in args.shape]
    dataflows = args.dataflow or DATAFLOWS
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalesim-") as tmp:
        for shape in shapes:
            for df in dataflows:
                s_cycles, s_wall, s_cpu = run_scalesim(py, Path(tmp), shape, df)
                d_cycles, d_total, d_wall, d_cpu = run_day0(day0, shape, df)
                rows.append((shape, df, s_cycles, d_cycles, d_total, s_wall, d_wall, s_cpu, d_cpu))
                print(f"{shape} {df}: SCALE-Sim {s_cycles} ({s_wall:.2f} s wall, {s_cpu:.2f} s CPU), "
                      f"day0 {d_cycles} ({d_wall * 1e3:.1f} ms wall, {d_cpu * 1e3:.1f} ms CPU)",
                      flush=True)
    out = Path(args.out)
    if not args.fresh and out.with_suffix(".csv").exists():
        done = {(r[0], r[1]) for r in rows}
        with open(out.with_suffix(".csv")) as f:
            for r in csv.DictReader(f):
                key = ((int(r["m"]), int(r["n"]), int(r["k"])), r["dataflow"])
                if key not in done:
                    rows.append((key[0], key[1], int(r["scalesim_cycles"]),
                                 int(r["day0_cycles"]), int(r["day0_total_with_memory"]),
                                 float(r["scalesim_wall_s"]), float(r["day0_wall_s"]),
                                 float(r["scalesim_cpu_s"]), float(r["day0_cpu_s"])))
    order = {s: i for i, s in enumerate(SHAPES)}
    rows.sort(key=lambda r: (order.get(r[0], len(order)), r[0], DATAFLOWS.index(r[1])))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["m", "n", "k", "dataflow", "scalesim_cycles", "day0_cycles",
                    "day0_total_with_memory", "scalesim_wall_s", "day0_wall_s",
                    "scalesim_cpu_s", "day0_cpu_s"])
        for (m, n, k), df, sc, dc, dt, sw, dw, scpu, dcpu in rows:
            w.writerow([m, n, k, df, sc, dc, dt, f"{sw:.3f}", f"{dw:.4f}", f"{scpu:.3f}",
                        f"{dcpu:.4f}"])
    mismatches = [r for r in rows if r[2] != r[3]]
    lines = [
        "# SCALE-Sim 3.0.0 vs day0: systolic-array compute cycles",
        "",
        f"Array {ARRAY[0]}x{ARRAY[1]} (preset `systolic-128`). Written by "
        "`tools/calibrate/scalesim_compare.py`; pinned by `tests/systolic_scalesim.rs`.",
        "SCALE-Sim cycles: COMPUTE_REPORT.csv \"Total Cycles\" (stall cycles 0 in every run).",
        "Wall times: whole processes (SCALE-Sim: `python -m scalesim.scale`, traces off; day0: "
        "`day0 kernel gemm --cost-only --json`, which also simulates the memory side).",
        "",
        "Wall and CPU (user + system) time of each process; the machine was shared with other "
        "builds, so wall times are stretched by the load.",
        "",
        "| M | N | K | dataflow | SCALE-Sim cycles | day0 cycles | equal | day0 with memory "
        "| SCALE-Sim wall (s) | day0 wall (ms) | wall speed-up | SCALE-Sim CPU (s) "
        "| day0 CPU (ms) | CPU speed-up |",
        "|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (m, n, k), df, sc, dc, dt, sw, dw, scpu, dcpu in rows:
        lines.append(f"| {m} | {n} | {k} | {df} | {sc} | {dc} | {'yes' if sc == dc else 'NO'} "
                     f"| {dt} | {sw:.2f} | {dw * 1e3:.1f} | {sw / dw:,.0f}x | {scpu:.2f} "
                     f"| {dcpu * 1e3:.1f} | {scpu / max(dcpu, 1e-4):,.0f}x |")
    lines.append("")
    lines.append(f"{len(rows) - len(mismatches)} of {len(rows)} runs equal.")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.csv')}")
    if mismatches:
        sys.exit(f"{len(mismatches)} runs differ")


if __name__ == "__main__":
    main()
