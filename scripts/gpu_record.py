"""The GPU record of issue 42 item 4: `python scripts/gpu_bench.py --record` runs this, one call on a lent GPU.

In order, fastest first, the JSON rewritten after every figure (a call cut off by its time limit keeps what it
measured):
1. copy bandwidth (device-to-device copy, bytes read + written / time);
2. per-kernel GB/s at 1, 2, 4, 8 and 16 rows on Llama-3-8B's projection shapes (merged QKV, O, merged gate/up,
   down): hearth's decode kernel (kernels/quant_gemv_triton.py, what quant_matmul_triton sends 1-16 rows to)
   and the old tl.dot kernel (the same call with explicit tiles) on the int4 (GGUF Q4_K's layout: groups of 32
   with scale and offset) and int8 (groups of 32: Q8_0's) layouts, hearth's q6 decode kernel (GGUF Q6_K as it
   is: kernels/q6_gemv_triton.py; it ran as int8 before), torch's int4 tinygemm
   (aten._weight_int4pack_mm, its own layout, groups of 32) and cuBLAS bf16 (F.linear).  GB/s counts the
   bytes of the weight as that kernel stores it (values, scales, offsets), so each figure compares with the
   copy bandwidth;
3. end to end on a random-block Llama-3-8B Q4_K_M GGUF written there (scripts/make_random_gguf.py):
   llama.cpp's llama-bench tg128 (`-p 0 -n 128 -ngl 99`) when its CUDA build was carried
   (scripts/build_llama_bench.sh), then hearth's torch engine (TorchBackend, the one `hearth serve` runs) on
   the file's own blocks (weight_quant "gguf") and dequantized to bf16, at 1 and 16 streams: greedy, 128
   tokens a stream, the streams' decode rates summed (RequestStats.decode_tokens_per_s: tokens after the
   first over the time after the first, so prefill is out, as in tg128).

The record, bench/gpu/<date>-<gpu>.json (the issue's format; `check_record` is its one definition):
{"gpu", "date", "copy_gbps", "kernels": [{"layout", "shape", "m", "kernel", "gbps"}],
 "end_to_end": [{"engine", "format", "streams", "tokens_per_s"}]}

--dry-run: the same code on CPU with tiny shapes (the Triton kernels under TRITON_INTERPRET=1), no llama-bench.
"""

from __future__ import annotations

import gc
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # make_random_gguf beside this file

import make_random_gguf  # after the path above

ROOT = Path(__file__).resolve().parents[1]
RECORD_DIR = ROOT / "bench" / "gpu"
# xz-compressed by scripts/build_llama_bench.sh (67.8 MB stripped would not travel: 64 MiB does); a plain binary there
# (or given with --llama-bench) runs as it is
LLAMA_BENCH = ROOT / "build" / "llama-bench-cuda" / "llama-bench.xz"
# (name, out_features, in_features) of Llama-3-8B's projections as the engine runs them (Q/K/V and gate/up merged)
SHAPES_8B = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
SHAPES_TINY = (("qkv", 128, 256), ("down", 256, 512))
ROWS = (1, 2, 4, 8, 16)
ROWS_TINY = (1, 4)
STREAMS = (1, 16)
STREAMS_TINY = (1, 2)
GEN_TOKENS = 128
GROUP = 32  # GGUF's blocks: the group of every quantized layout measured here
# seconds a stage is guessed to need on an H100 (8B shapes), so a stage that would overrun --budget-s is
# skipped with a line that says so instead of being cut off mid-way
STAGE_S = {"gguf": 40, "llama.cpp": 45, "torch Q4_K_M": 100, "torch bf16": 150}

RECORD_KEYS = {"gpu": str, "date": str, "copy_gbps": float, "kernels": list, "end_to_end": list}
KERNEL_KEYS = {"layout": str, "shape": str, "m": int, "kernel": str, "gbps": float}
E2E_KEYS = {"engine": str, "format": str, "streams": int, "tokens_per_s": float}


def check_record(data: dict) -> None:
    """Raise ValueError unless `data` is a record in the issue's format (keys exactly these, values these types)."""

    def check(obj: dict, keys: dict[str, type], where: str) -> None:
        if set(obj) != set(keys):
            raise ValueError(f"{where}: keys {sorted(obj)}, expected {sorted(keys)}")
        for key, kind in keys.items():
            if not isinstance(obj[key], kind) or isinstance(obj[key], bool):
                raise ValueError(f"{where}: {key} is {type(obj[key]).__name__}, expected {kind.__name__}")

    check(data, RECORD_KEYS, "record")
    for i, row in enumerate(data["kernels"]):
        check(row, KERNEL_KEYS, f"kernels[{i}]")
    for i, row in enumerate(data["end_to_end"]):
        check(row, E2E_KEYS, f"end_to_end[{i}]")


def dumps(data: dict) -> str:
    """The record as JSON with one line per figure (diffs of committed records stay readable)."""
    parts = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if not isinstance(v, list)]
    for key in ("kernels", "end_to_end"):
        rows = ",\n".join(f"  {json.dumps(row)}" for row in data[key])
        parts.append(f" {json.dumps(key)}: [\n{rows}\n ]" if rows else f" {json.dumps(key)}: []")
    return "{\n" + ",\n".join(parts) + "\n}\n"


class Record:
    """The record being measured, rewritten whole (to a temporary file, then renamed) after every figure."""

    def __init__(self, folder: Path, gpu: str, copy_gbps: float) -> None:
        date = time.strftime("%Y-%m-%d", time.gmtime())
        slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        self.path = Path(folder) / f"{date}-{slug}.json"
        self.data: dict = {
            "gpu": gpu,
            "date": date,
            "copy_gbps": float(f"{copy_gbps:.4g}"),
            "kernels": [],
            "end_to_end": [],
        }
        self.save()

    def kernel(self, layout: str, shape: str, m: int, kernel: str, gbps: float) -> None:
        row = {"layout": layout, "shape": shape, "m": m, "kernel": kernel, "gbps": float(f"{gbps:.4g}")}
        self.data["kernels"].append(row)
        self.save()

    def end_to_end(self, engine: str, fmt: str, streams: int, tokens_per_s: float) -> None:
        row = {"engine": engine, "format": fmt, "streams": streams, "tokens_per_s": float(f"{tokens_per_s:.4g}")}
        self.data["end_to_end"].append(row)
        self.save()

    def save(self) -> None:
        check_record(self.data)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(dumps(self.data))
        os.replace(tmp, self.path)


# ---- kernels ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One kernel on one weight: `run(x)` with x (m, in_features) -> (m, out_features)."""

    layout: str  # "int4" | "int8" | "q6" | "bf16"
    kernel: str  # "hearth" | "old" | "tinygemm" | "cublas"
    weight_bytes: int  # what the kernel reads of the weight: values, scales, offsets, in its own layout
    run: Callable


def seconds_per_call(fn: Callable[[], object], cuda: bool) -> float:
    """Median GPU time of one call (Triton's do_bench: L2 flushed before each call, so the weights come from
    HBM as in a real decode step whose layers do not fit in L2); on CPU, the mean of two calls after one."""
    if cuda:
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") / 1e3
    fn()
    start = time.perf_counter()
    for _ in range(2):
        fn()
    return (time.perf_counter() - start) / 2


def quant_cases(n: int, k: int, device, dtype) -> list[Case]:
    """hearth's decode kernel and the old tl.dot kernel on random int4 and int8 weights (groups of 32) and q6 ones."""
    import torch

    from kernels import q6_matmul_triton
    from kernels import quant_matmul_triton as qmt
    from kernels.quant_matmul import QuantWeight

    scales = lambda: (torch.rand(n, k // GROUP, device=device) * 1e-3 + 1e-4).to(dtype)  # noqa: E731
    int4 = QuantWeight(
        "int4",
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device),
        scales(),
        -8 * scales(),
        GROUP,
        k,
        n,
    )
    int8 = QuantWeight(
        "int8", torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device), scales(), None, GROUP, k, n
    )
    cases = []
    for w in (int4, int8):
        cases.append(Case(w.kind, "hearth", w.nbytes, lambda x, w=w: qmt.quant_matmul_triton(x, w)))
        # explicit tiles: the same call as the engine's before issue 42, the tl.dot kernel at every row count
        old = lambda x, w=w: qmt.quant_matmul_triton(x, w, blocks=qmt._pick_blocks(x.shape[0], n, k, x.device))  # noqa: E731
        cases.append(Case(w.kind, "old", w.nbytes, old))
    # GGUF Q6_K as it is (kernels/q6_gemv_triton.py; before issue 42 it ran as int8, which the int8 rows measure);
    # its "old" is its tl.dot kernel (q6_matmul_triton, what takes more than 16 rows) at every row count
    q6 = QuantWeight(
        "q6",
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device),
        torch.randint(0, 16, (n, k // 16), dtype=torch.int8, device=device),
        None,
        16,
        k,
        n,
        qhigh=torch.randint(0, 256, (n, k // 4), dtype=torch.uint8, device=device),
        super_scales=(torch.rand(n, k // 256, device=device) * 1e-4 + 6e-5).half(),
    )
    cases.append(Case("q6", "hearth", q6.nbytes, lambda x: qmt.quant_matmul_triton(x, q6)))
    cases.append(Case("q6", "old", q6.nbytes, lambda x: q6_matmul_triton.q6_matmul_triton(x, q6)))
    return cases


def tinygemm_case(n: int, k: int, device) -> Case:
    """torch's int4 tinygemm (the kernel behind torchao's int4 weight-only and gpt-fast), groups of 32, bf16
    activations: packed on CUDA as its CUDA kernel wants ((N, K / 2) uint8, 8 inner K tiles), on CPU with its
    CPU twin (the dry run)."""
    import torch

    q = torch.randint(0, 16, (n, k), dtype=torch.int32, device=device)
    sz = (torch.rand(k // GROUP, n, 2, device=device) * 1e-3).to(torch.bfloat16)  # (groups, N, scale | zero)
    if device.type == "cuda":
        packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
        mm = torch.ops.aten._weight_int4pack_mm
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8)
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    weight_bytes = n * k // 2 + sz.numel() * sz.element_size()
    return Case("int4", "tinygemm", weight_bytes, lambda x: mm(x.to(torch.bfloat16), packed, GROUP, sz))


def cublas_case(n: int, k: int, device, dtype) -> Case:
    """The dense weight in the compute dtype through F.linear (cuBLAS on a GPU): the bar a quantized kernel has to
    beat per token, at a quarter (int4) or half (int8) of the bytes."""
    import torch
    import torch.nn.functional as F

    w = (torch.randn(n, k, device=device) * 0.02).to(dtype)
    return Case("bf16", "cublas", w.numel() * w.element_size(), lambda x: F.linear(x, w))


def compare_kernels(cases: list[Case], x, shape: str) -> None:
    """hearth's kernel against the old one on the same weight and rows: a miscompile shows here as a line."""
    import torch

    for layout in ("int4", "int8", "q6"):
        new, old = (next(c for c in cases if c.layout == layout and c.kernel == k) for k in ("hearth", "old"))
        a, b = new.run(x).float(), old.run(x).float()
        rel = ((a - b).abs().max() / b.abs().max().clamp(min=1e-6)).item()
        flag = "" if rel < 2e-2 and torch.isfinite(a).all() else "   <-- DIFFER"
        print(f"  {layout} {shape} m={x.shape[0]}: hearth vs old max |diff| / max |old| = {rel:.1e}{flag}")


def kernel_rows(record: Record, shapes, rows: tuple[int, ...], device, dtype, strict: bool = False) -> None:
    """Every case at every row count into the record, printed as it goes.  A case that fails is dropped with a
    line saying why, unless `strict` (the dry run: there a failure is a bug in this script)."""
    import torch

    cuda = device.type == "cuda"
    for name, n, k in shapes:
        shape = f"{name} {n}x{k}"
        cases = quant_cases(n, k, device, dtype)
        try:
            cases.insert(2, tinygemm_case(n, k, device))  # after int4's hearth and old
        except Exception as e:  # an op this torch build lacks for this device: the other kernels still count
            if strict:
                raise
            print(f"  tinygemm {shape}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
        cases.append(cublas_case(n, k, device, dtype))
        for m in sorted({1, max(rows)}):  # the one-row kernel and the many-row one
            try:
                compare_kernels(cases, torch.randn(m, k, device=device).to(dtype), shape)
            except Exception as e:  # the timings below say which kernel fails; this line says why
                if strict:
                    raise
                print(f"  compare {shape} m={m}: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
        for m in rows:
            x = torch.randn(m, k, device=device).to(dtype)
            line = []
            for case in list(cases):
                try:
                    with torch.inference_mode():
                        t = seconds_per_call(lambda: case.run(x), cuda)
                except Exception as e:  # one failing kernel must not cost the rest of the record
                    if strict:
                        raise
                    print(f"  {case.layout}/{case.kernel} {shape} m={m}: failed, dropped ({type(e).__name__}: {e})")
                    cases.remove(case)
                    continue
                gbps = case.weight_bytes / t / 1e9
                record.kernel(case.layout, shape, m, case.kernel, gbps)
                line.append(f"{case.layout}/{case.kernel} {gbps:7.1f}")
            print(f"  {shape:>18} m={m:2d}: " + "  ".join(line), flush=True)
        del cases
        if cuda:
            torch.cuda.empty_cache()


# ---- end to end --------------------------------------------------------------------------------------------------


def cuda_library_dirs() -> list[str]:
    """Folders of the CUDA libraries the carried llama-bench loads at run time (cuBLAS, cuBLASLt: too big to
    carry): the pip packages torch's CUDA build brings (nvidia/cu13/lib, nvidia/cublas/lib, ...)."""
    found: list[str] = []
    for entry in sys.path:
        for lib in sorted(Path(entry or ".").glob("nvidia/*/lib/libcublas.so*")):
            if str(lib.parent) not in found:
                found.append(str(lib.parent))
    return found


def runnable(binary: Path, folder: Path) -> Path:
    """`binary` ready to run: an .xz one unpacked into `folder` (Python's lzma: no xz needed there), executable."""
    if binary.suffix != ".xz":
        return binary
    out = folder / binary.stem
    with lzma.open(binary) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    out.chmod(0o755)
    return out


def llama_bench_tokens_per_s(binary: Path, gguf: Path, timeout_s: float = 300) -> float | None:
    """llama-bench tg128 on all layers of the GPU (its mean over 5 repetitions), or None with the reason printed."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([*cuda_library_dirs(), env.get("LD_LIBRARY_PATH", "")]).strip(":")
    cmd = [str(binary), "-m", str(gguf), "-p", "0", "-n", str(GEN_TOKENS), "-ngl", "99", "-r", "5", "-o", "json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"  llama-bench: failed to run ({e})")
        return None
    if proc.returncode != 0:
        tail = "\n    ".join(proc.stderr.strip().splitlines()[-15:])
        print(f"  llama-bench: exit {proc.returncode} (LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}):\n    {tail}")
        return None
    rows = [r for r in json.loads(proc.stdout) if r.get("n_gen") == GEN_TOKENS and r.get("n_prompt") == 0]
    if not rows:
        print(f"  llama-bench: no tg{GEN_TOKENS} row in its output")
        return None
    r = rows[0]
    print(
        f"  llama-bench tg{GEN_TOKENS}: {r['avg_ts']:.1f} +- {r.get('stddev_ts', 0):.1f} tok/s  "
        f"({r.get('gpu_info', '?')}, build {r.get('build_commit', '?')}, flash_attn {r.get('flash_attn', '?')})"
    )
    return float(r["avg_ts"])


def torch_engine_tokens_per_s(
    gguf: Path, weight_quant: str, streams: tuple[int, ...], device: str, gen_tokens: int
) -> dict[int, float]:
    """{streams: decode tokens/s summed over the streams} of hearth's torch engine on `gguf`."""
    import torch

    from backends.api import LoadOptions, Request, SamplingParams
    from backends.modelspec import load_spec
    from backends.torch_engine.backend import TorchBackend

    spec = load_spec(gguf)
    options = LoadOptions(
        n_ctx=64 + gen_tokens, max_num_seqs=max(streams), device=device, dtype="bfloat16", weight_quant=weight_quant
    )
    began = time.perf_counter()
    backend = TorchBackend(spec, options)
    backend.load()
    print(f"  torch engine ({weight_quant}) loaded in {time.perf_counter() - began:.1f} s", flush=True)

    def run(n: int, tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        prompts = [tuple(300 + (97 * s + 13 * i) % (spec.vocab_size - 300) for i in range(16)) for s in range(n)]
        with ThreadPoolExecutor(n) as pool:
            done = list(pool.map(lambda p: backend.generate(Request(prompt_token_ids=p, sampling=params)), prompts))
        errors = [c.error for c in done if c.error]
        if errors:
            raise RuntimeError(f"torch engine, {n} streams: {errors[0]}")
        return sum(c.stats.decode_tokens_per_s for c in done)

    try:
        for n in sorted(set(streams)):  # warm-up: Triton compiles, CUDA graphs are captured for each batch size
            run(n, 8)
        return {n: run(n, gen_tokens) for n in streams}
    finally:
        backend.close()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class Deadline:
    """What is left of --budget-s: a stage that is guessed to need more is skipped, with a line saying so."""

    def __init__(self, budget_s: float, began: float) -> None:
        self.end = began + budget_s

    def allows(self, stage: str, scale: float) -> bool:
        left = self.end - time.perf_counter()
        if STAGE_S[stage] * scale <= left:
            return True
        print(f"  {stage}: skipped (about {STAGE_S[stage] * scale:.0f} s needed, {left:.0f} s of --budget-s left)")
        return False


def end_to_end_rows(record: Record, args, device: str, deadline: Deadline) -> None:
    """The random 8B Q4_K_M GGUF (tiny in the dry run) through llama-bench and the torch engine."""
    shape = make_random_gguf.TINY if args.dry_run else make_random_gguf.LLAMA3_8B
    scale = 0.0 if args.dry_run else 1.0
    streams = STREAMS_TINY if args.dry_run else STREAMS
    gen_tokens = 8 if args.dry_run else GEN_TOKENS
    if not deadline.allows("gguf", scale):
        return
    with tempfile.TemporaryDirectory(prefix="hearth-record-") as tmp:
        began = time.perf_counter()
        gguf = make_random_gguf.write_random_q4_k_m(Path(tmp) / "random-8b-q4_k_m.gguf", shape)
        print(f"  random Q4_K_M GGUF: {gguf.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - began:.1f} s")
        binary = Path(args.llama_bench)
        if args.dry_run:
            print("  llama-bench: not run in the dry run")
        elif not binary.is_file():
            print(f"  llama-bench: {binary} is not there (scripts/build_llama_bench.sh builds it; carry its folder)")
        elif deadline.allows("llama.cpp", scale):
            tps = llama_bench_tokens_per_s(runnable(binary, Path(tmp)), gguf)
            if tps is not None:
                record.end_to_end("llama.cpp", "Q4_K_M", 1, tps)
        for fmt, weight_quant in (("Q4_K_M", "gguf"), ("bf16", "none")):
            if not deadline.allows(f"torch {fmt}", scale):
                continue
            try:
                speeds = torch_engine_tokens_per_s(gguf, weight_quant, streams, device, gen_tokens)
            except Exception:  # the other format's rows still count; the traceback says what broke
                if args.dry_run:
                    raise
                traceback.print_exc()
                continue
            for n, tps in speeds.items():
                print(f"  torch engine {fmt} ({weight_quant}) {n:2d} streams: {tps:9.1f} tok/s", flush=True)
                record.end_to_end("torch", fmt, n, tps)


# ---- the table and the call --------------------------------------------------------------------------------------


def markdown_table(data: dict) -> str:
    """The record as the README's tables: kernels (GB/s and share of the copy bandwidth per row count), then
    end to end."""
    copy = data["copy_gbps"]
    ms = sorted({r["m"] for r in data["kernels"]})
    lines = [
        f"{data['gpu']}, {data['date']}: copy bandwidth {copy:.0f} GB/s",
        "",
        "| layout | shape | kernel | " + " | ".join(f"m={m} GB/s (%)" for m in ms) + " |",
        "|---|---|---|" + "---|" * len(ms),
    ]
    groups: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in data["kernels"]:
        groups.setdefault((r["layout"], r["shape"], r["kernel"]), {})[r["m"]] = r["gbps"]
    for (layout, shape, kernel), by_m in groups.items():
        cells = [f"{by_m[m]:.0f} ({100 * by_m[m] / copy:.0f}%)" if m in by_m else "" for m in ms]
        lines.append(f"| {layout} | {shape} | {kernel} | " + " | ".join(cells) + " |")
    lines += ["", "| engine | format | streams | tokens/s |", "|---|---|---|---|"]
    for r in data["end_to_end"]:
        lines.append(f"| {r['engine']} | {r['format']} | {r['streams']} | {r['tokens_per_s']:.1f} |")
    return "\n".join(lines)


def run_record(args, measure_bandwidth: Callable[[str], float]) -> Path:
    """The whole record (module docstring); returns the JSON's path.  `measure_bandwidth(device)` -> bytes/s."""
    import torch

    began = time.perf_counter()
    deadline = Deadline(args.budget_s, began)
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    gpu = "cpu-dry-run" if args.dry_run else torch.cuda.get_device_name()
    bw = measure_bandwidth(device.type)
    record = Record(Path(args.record_dir), gpu, bw / 1e9)
    print(f"record: {record.path}; {gpu}; torch {torch.__version__}; copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    shapes, rows = (SHAPES_TINY, ROWS_TINY) if args.dry_run else (SHAPES_8B, ROWS)
    kernel_rows(record, shapes, rows, device, dtype, strict=args.dry_run)
    print(f"kernels done at {time.perf_counter() - began:.0f} s", flush=True)
    end_to_end_rows(record, args, device.type, deadline)
    print(f"\n{markdown_table(record.data)}\n\nrecord written: {record.path} ({time.perf_counter() - began:.0f} s)")
    return record.path
