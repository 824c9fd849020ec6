"""Process CPU time per decoded token, llama.cpp against the torch engine's runner, in one process, interleaved.

    .venv/bin/python scripts/decode_cpu_time.py [--threads 1] [--rounds 3] [--gen 128] [--eager] [--model PATH]

Both engines decode the same 128-token prompt greedily, `--rounds` times each, alternating, so both see the same
minutes of a shared machine.  CPU time (not wall time) is what a loaded machine distorts least; the README's
"Where a single-stream decode step's time goes (CPU)" quotes it.  Wall time per token is printed beside it: with
more than one thread, OpenMP's and ggml's waiting threads spin, so CPU time there counts the spinning too.
--eager runs the torch engine without its scripted decode loop (HEARTH_SCRIPTED_DECODE=0), for comparison.
--model: another GGUF file (default: the starter model).  Needs llama-cpp-python.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--eager", action="store_true", help="the torch engine without its scripted decode loop")
    ap.add_argument("--model", default=None, help="a GGUF file (default: the starter model)")
    args = ap.parse_args()
    if args.eager:
        os.environ["HEARTH_SCRIPTED_DECODE"] = "0"

    import torch

    from app.store import starter_model_path
    from backends.api import LoadOptions
    from backends.llama_cpp.backend import open_llama
    from backends.modelspec import load_spec
    from backends.torch_engine.model_runner import ModelRunner

    torch.set_num_threads(args.threads)
    path = args.model or str(starter_model_path())
    # open_llama: this machine's extra-buffer rule (a bare Llama segfaults at the first decode on an AMX CPU)
    llm = open_llama(path, n_ctx=512, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    options = LoadOptions(n_ctx=512, max_num_seqs=1, device="cpu", adaptive_threads=False, n_threads=args.threads)
    runner = ModelRunner(load_spec(path), options)
    text = b"The history of the city begins with a small settlement by the river, where"
    prompt = (llm.tokenize(text, add_bos=False) * 20)[:128]

    def llama_run() -> tuple[float, float]:
        llm.reset()
        llm.eval(prompt)
        c0, w0 = time.process_time(), time.perf_counter()
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
        for _ in range(args.gen):
            llm.eval([tok])
            tok = int(llm.scores[llm.n_tokens - 1].argmax())
        return (time.process_time() - c0) / args.gen * 1e3, (time.perf_counter() - w0) / args.gen * 1e3  # CPU, wall

    def torch_run() -> tuple[float, float]:
        table = list(range(32))
        logits = runner.forward([(prompt, 0, table)], "last", num_decodes=0)
        c0, w0 = time.process_time(), time.perf_counter()
        tok = int(logits.argmax())
        for i in range(args.gen):
            logits = runner.forward([([tok], len(prompt) + i, table)], "last", num_decodes=1)
            tok = int(logits.argmax())
        return (time.process_time() - c0) / args.gen * 1e3, (time.perf_counter() - w0) / args.gen * 1e3

    torch_run()  # the first decode steps pack the int8 head and check the scripted loop: not timed
    times: dict[str, list[tuple[float, float]]] = {"llama.cpp": [], "torch": []}
    for _ in range(args.rounds):
        times["llama.cpp"].append(llama_run())
        times["torch"].append(torch_run())
    for name, runs in times.items():
        cpu, wall = sorted(c for c, _ in runs), sorted(w for _, w in runs)
        print(
            f"{name:9s} {args.threads} thread(s): CPU ms/token best {cpu[0]:.2f}, median {cpu[len(cpu) // 2]:.2f}; "
            f"wall ms/token best {wall[0]:.2f}, median {wall[len(wall) // 2]:.2f}"
        )
    best = {name: (min(c for c, _ in runs), min(w for _, w in runs)) for name, runs in times.items()}
    print(
        f"torch / llama.cpp speed: {best['llama.cpp'][0] / best['torch'][0]:.2f}x by best CPU time, "
        f"{best['llama.cpp'][1] / best['torch'][1]:.2f}x by best wall time"
    )


if __name__ == "__main__":
    main()
