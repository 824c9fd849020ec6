#!/usr/bin/env python3
"""Issue 42 item 5: the GPU records in bench/gpu/ (scripts/gpu_record.py) fed to the planner, as the rows of its
speed model's table (hwprobe/decode_speed.TABLE) that hwprobe/recorded_rows.py holds.  Run after committing a
record; tests/kernels/test_gpu_record_table.py fails while recorded_rows.py is not what the records give.

    python scripts/gpu_record_table.py            # rewrite hwprobe/recorded_rows.py from bench/gpu/*.json
    python scripts/gpu_record_table.py --check    # exit 1 when it would change

What a record gives, for its GPU's generation (hwprobe/gpus.known_generation) and peak bandwidth (the planner's
own figure for that card, hwprobe/gpus.known_bandwidth_gbps: the share is of the figure it multiplies):
- llama.cpp "ggml": llama-bench tg128 on the random-block Llama-3-8B Q4_K_M, reading the file's tensors but the
  token embedding (one row a token) a token;
- torch "16bit": the torch engine on that file dequantized to bf16, at 1 and 16 streams;
- torch "int4", "int8", "q6": the engine on the file's own blocks (int4 projections, q6 V / down / head, kind by
  kind as the loader keeps them on a GPU) is one end-to-end figure for a mix of kinds.  It is split by the kernels'
  own GB/s at one row (median over the four projection shapes, kernel "hearth"): each kind's share is its kernel's
  GB/s times one factor, the factor that makes the mix of the file's bytes take the measured time per token.
  int8 (in no Q4_K_M file) takes the same factor.  Their 16-stream gain is the mix's.
The newest record of a generation wins.  A kind without its figures keeps the hand-entered row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # make_random_gguf, gpu_record beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages

import gpu_record  # after the paths above
import make_random_gguf

from backends.weight_map import GPU_REPACK_KIND
from hwprobe.bandwidth import GPU_SECONDS_PER_LAYER
from hwprobe.decode_speed import Measured
from hwprobe.gpus import known_bandwidth_gbps, known_generation
from hwprobe.memory import GGUF_Q6_BYTES, GGUF_REPACKED_INT4_BYTES, GGUF_REPACKED_INT8_BYTES

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "gpu"
OUTPUT = ROOT / "hwprobe" / "recorded_rows.py"
SHAPE = make_random_gguf.LLAMA3_8B
KIND_BYTES = {"int4": GGUF_REPACKED_INT4_BYTES, "int8": GGUF_REPACKED_INT8_BYTES, "q6": GGUF_Q6_BYTES}
QUANT_KINDS = ("int4", "int8", "q6")


def bytes_per_token() -> dict[str, float]:
    """What a decode step reads of the record's 8B Q4_K_M file (the token embedding is one row: not counted):
    "llama.cpp" the file's tensors, "bf16" the engine's dense copy, and per kind the engine's own blocks
    ("int4", "q6"; "f32" the norms)."""
    out = {"llama.cpp": 0.0, "bf16": 0.0, "int4": 0.0, "q6": 0.0, "int8": 0.0, "f32": 0.0}
    for name, ggml_type, dims in make_random_gguf.tensor_plan(SHAPE):
        if name == "token_embd.weight":
            continue
        n = dims[0] * (dims[1] if len(dims) == 2 else 1)
        if ggml_type == "F32":
            out["llama.cpp"] += 4 * n
            out["bf16"] += 4 * n
            out["f32"] += 4 * n
            continue
        block_bytes, block_values = make_random_gguf.BLOCK[ggml_type]
        out["llama.cpp"] += n // block_values * block_bytes
        out["bf16"] += 2 * n
        kind = GPU_REPACK_KIND[ggml_type]
        out[kind] += n * KIND_BYTES[kind]
    return out


def _measured_args(tokens_per_s: float, n_bytes: float, peak: float, source: str, tokens_16: float | None) -> tuple:
    return (
        round(tokens_per_s, 2),
        n_bytes,
        SHAPE.layers,
        peak,
        source,
        None if tokens_16 is None else round(tokens_16, 2),
    )


def _tokens_for_share(share: float, n_bytes: float, peak: float) -> float:
    """The tokens/s a step reading `n_bytes` at `share` of `peak` decodes (Measured.share's inverse)."""
    return 1.0 / (n_bytes / (peak * 1e9 * share) + SHAPE.layers * GPU_SECONDS_PER_LAYER)


def table_rows(record: dict, name: str = "") -> tuple[str, dict[tuple[str, str], tuple]]:
    """(generation, {(engine, kind): Measured's arguments}) of one record (the module docstring)."""
    gpu_record.check_record(record)
    gpu = record["gpu"]
    peak, gen = known_bandwidth_gbps(gpu), known_generation(gpu)
    if peak is None or gen is None:
        raise ValueError(f"{gpu}: not in hwprobe/gpus.py's tables (bandwidth and generation): add it there first")
    source = f"scripts/gpu_bench.py --record on an {gpu} ({record['date']}{', ' + name if name else ''})"
    e2e = {(r["engine"], r["format"], r["streams"]): r["tokens_per_s"] for r in record["end_to_end"]}
    read = bytes_per_token()
    rows: dict[tuple[str, str], tuple] = {}
    if ("llama.cpp", "Q4_K_M", 1) in e2e:
        tg = e2e["llama.cpp", "Q4_K_M", 1]
        rows["llama.cpp", "ggml"] = _measured_args(tg, read["llama.cpp"], peak, f"{source}: llama-bench tg128", None)
    if ("torch", "bf16", 1) in e2e:
        one, sixteen = e2e["torch", "bf16", 1], e2e.get(("torch", "bf16", 16))
        rows["torch", "16bit"] = _measured_args(one, read["bf16"], peak, f"{source}: bf16 end to end", sixteen)
    one_row: dict[str, list[float]] = {}  # the decode kernels' GB/s at one row, per kind, over the shapes
    for r in record["kernels"]:
        if r["kernel"] == "hearth" and r["m"] == 1 and r["layout"] in QUANT_KINDS:
            one_row.setdefault(r["layout"], []).append(r["gbps"])
    gbps = {kind: statistics.median(figures) for kind, figures in one_row.items()}
    mix = [k for k in ("int4", "q6") if read[k]]
    if ("torch", "Q4_K_M", 1) in e2e and all(k in gbps for k in mix):
        one, sixteen = e2e["torch", "Q4_K_M", 1], e2e.get(("torch", "Q4_K_M", 16))
        total = sum(read[k] for k in mix) + read["f32"]
        share = Measured(one, total, SHAPE.layers, peak, "").share
        # sum_k b_k / (peak s_k) = total / (peak share), s_k = c g_k / peak  =>  c = share peak sum(b_k / g_k) / total
        factor = share * peak * sum(read[k] / gbps[k] for k in mix) / sum(read[k] for k in mix)
        gain = sixteen / one if sixteen else None
        for kind, g in gbps.items():
            s = min(1.0, factor * g / peak)
            tokens = _tokens_for_share(s, total, peak)
            why = f"{source}: Q4_K_M end to end split by the {kind} kernel's GB/s"
            rows["torch", kind] = _measured_args(tokens, total, peak, why, None if gain is None else tokens * gain)
    return gen, rows


def all_rows(folder: Path = RECORDS) -> dict[tuple[str, str], dict[str, tuple]]:
    """Every record of `folder`, oldest first, so that the newest of a generation wins."""
    out: dict[tuple[str, str], dict[str, tuple]] = {}
    for path in sorted(folder.glob("*.json")):
        gen, rows = table_rows(json.loads(path.read_text()), f"bench/gpu/{path.name}")
        for key, args in rows.items():
            out.setdefault(key, {})[gen] = args
    return out


def render(rows: dict[tuple[str, str], dict[str, tuple]]) -> str:
    """hwprobe/recorded_rows.py for `rows`: its docstring, then ROWS as a literal."""
    head = OUTPUT.read_text().split("ROWS:", 1)[0] if OUTPUT.exists() else '"""GENERATED"""\n\n'
    body = (
        "{}"
        if not rows
        else "{\n"
        + "".join(
            f"    {key!r}: {{\n" + "".join(f"        {gen!r}: {args!r},\n" for gen, args in by.items()) + "    },\n"
            for key, by in sorted(rows.items())
        )
        + "}"
    )
    return head + f"ROWS: dict[tuple[str, str], dict[str, tuple]] = {body}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when hwprobe/recorded_rows.py is out of date")
    parser.add_argument("--records", default=str(RECORDS), help="the folder of GPU records (default: bench/gpu)")
    args = parser.parse_args(argv)
    text = render(all_rows(Path(args.records)))
    if args.check:
        same = OUTPUT.read_text() == text
        print("hwprobe/recorded_rows.py is up to date" if same else "hwprobe/recorded_rows.py is out of date")
        return 0 if same else 1
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
