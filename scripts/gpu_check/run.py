"""The GPU check (issue 27): runs each section in turn, each guarded, writing gpu_report.md/.json as it goes.

Without CUDA it is a dry run of the same code: the Triton interpreter, the engine's CPU path, tiny models.
Usage: run.py --out DIR [--only SECTION ...] (gpu_check.sh sets PYTHONPATH and the package metadata).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import sec_consistency
import sec_kernels
import sec_parity
import sec_quantized
import sec_server
import sec_throughput
import torch
from report import Report

SECTIONS = {
    "kernels": ("Triton kernels vs torch references", sec_kernels.run),
    "parity": ("Engine vs transformers (same device, same weights)", sec_parity.run),
    "consistency": ("Batched, CUDA-graph, chunked, prefix-cached and preempted runs vs one at a time",
                    sec_consistency.run),
    "throughput": ("Throughput, Llama-3.2-1B-shaped, bf16", sec_throughput.run),
    "quantized": ("GGUF Q4_0 and Q8_0 kept quantized, Llama-3.2-1B-shaped", sec_quantized.run),
    "server": ("modelplex serve: OpenAI streamed chat and Triton generate_stream", sec_server.run),
}


@dataclass
class Check:
    """What every section gets: where it runs and writes, and how much time is left."""

    root: Path
    out_dir: Path
    work_dir: Path
    device: str
    dry_run: bool
    deadline: float

    def timeout(self, wanted: float) -> float:
        return max(10.0, min(wanted, self.deadline - time.monotonic()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), help="sections to run (default: all)")
    parser.add_argument("--budget-s", type=float, default=450, help="sections stop being started after this")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:  # the dry run checks the script, not the CPU path: skip building its C++ ops (~15-45 s)
        os.environ.setdefault("MODELPLEX_CPU_ATTENTION", "torch")
    started = time.monotonic()
    report = Report(args.out, "modelplex GPU check" + ("" if cuda else " — CPU dry run"))
    note_machine(report, cuda)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        check = Check(Path(__file__).resolve().parents[2], args.out, Path(work), "cuda" if cuda else "cpu", not cuda,
                      started + args.budget_s)
        for name in args.only or SECTIONS:
            title, section = SECTIONS[name]
            with report.section(name, title):
                if time.monotonic() > check.deadline:
                    report.skip(f"the {args.budget_s:.0f} s budget is spent")
                else:
                    section(check, report)
    report.note(f"total {time.monotonic() - started:.0f} s; " + ", ".join(
        f"{name} {s['status']}" for name, s in report.sections.items()))
    return 0 if report.ok else 1


def note_machine(report: Report, cuda: bool) -> None:
    import transformers
    import triton

    device = torch.cuda.get_device_name() if cuda else f"no CUDA device ({platform.processor() or 'cpu'})"
    report.note(f"device: {device}; python {sys.version.split()[0]}, torch {torch.__version__}, "
                f"triton {triton.__version__}, transformers {transformers.__version__}")
    if cuda:
        props = torch.cuda.get_device_properties(0)
        report.note(f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB")


if __name__ == "__main__":
    sys.exit(main())
