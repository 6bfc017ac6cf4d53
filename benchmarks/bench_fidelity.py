"""Fidelity to the float model: how close each system's next-token distributions are to the reference's on a fixed
text, measured as llama.cpp's own ``llama-perplexity --kl-divergence`` measures a quantized file.

    python benchmarks/bench_fidelity.py --model qwen2.5-coder-0.5b [--settings default float32 ...]
        [--llama-perplexity ../peers/llama-perplexity] [--chunks 40] [--ctx 512] [--out FILE.json]

The text (``benchmarks/data/fidelity_text.txt``, ~24k tokens of Python's language reference) is cut into
``--chunks`` chunks of ``--ctx`` tokens; each chunk is evaluated from an empty cache and the second half of its
positions is scored (llama-perplexity's convention), so every scored token has at least ctx / 2 tokens of
context. The reference is transformers in float32 on the dequantized GGUF; its log-probs are written in
llama.cpp's base file (the 16-bit form below), and every system is scored against that file as llama-perplexity
scores itself: the KL divergence over the tokens the base gives a log-prob above -16, its mean and 99th
percentile; top-1 agreement with the base; the mean change of the next token's probability (llama.cpp's Δp);
and the text's perplexity. Beside these, the mean change in the reference's top token's log-prob (against the
exact reference).

Systems: radixlm's settings (``--settings``: ``default`` is plain ``Engine(model)``; the others are weight forms
and dtypes radixlm can choose), each chunk through the same ModelRunner a served prompt's prefill takes, scored
from its exact logits by a port of llama-perplexity's scoring; and llama.cpp's CPU backend on the same file:
``llama-perplexity --kl-divergence`` against the base file (its printed statistics), and its saved log-probs for
the top-token change (their 16-bit rounding, at most 16 / 65535, is the only difference there). llama.cpp's
tokens are the ones every system is given, where it runs.

llama.cpp's file: ``_logits_``, uint32 n_ctx, int32 n_vocab, int32 n_chunk, int32 tokens [n_chunk * n_ctx], then
per chunk the log-probs of positions n_ctx / 2 .. n_ctx - 2 (each predicting the next token), one record per
position of nv = 2 * ceil(n_vocab / 2) + 4 uint16: float32 scale and float32 min_log_prob (4 uint16), then per
token round((logit - min_logit) / scale), 0 for a logit at or below min_logit = max(min logit, max logit - 16);
a token's log-prob is scale * q + min_log_prob.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import torch
from harness import cpu_description, hf_model, hf_tokenizer, save_result

from radixlm.runtime.model.sources import resolve_model

TEXT = os.path.join(os.path.dirname(__file__), "data", "fidelity_text.txt")
MAGIC = b"_logits_"


def _header(f) -> tuple[int, int, int]:
    if f.read(8) != MAGIC:
        raise ValueError("not a llama.cpp log-probability file")
    n_ctx, n_vocab, n_chunk = np.frombuffer(f.read(12), dtype=np.int32)
    return int(n_ctx), int(n_vocab), int(n_chunk)


def read_tokens(path: str) -> list[int]:
    with open(path, "rb") as f:
        n_ctx, _, n_chunk = _header(f)
        return np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype=np.int32).tolist()


def read_logprobs(path: str) -> Iterator[torch.Tensor]:
    """Each chunk's log-probs, float32 [n_ctx - 1 - n_ctx / 2, n_vocab]."""
    with open(path, "rb") as f:
        n_ctx, n_vocab, n_chunk = _header(f)
        f.seek(4 * n_ctx * n_chunk, 1)
        nv = 2 * ((n_vocab + 1) // 2) + 4
        rows = n_ctx - 1 - n_ctx // 2
        for _ in range(n_chunk):
            yield decode_logprobs(np.frombuffer(f.read(2 * nv * rows), dtype=np.uint16).reshape(rows, nv), n_vocab)


def encode_logprobs(logits: torch.Tensor) -> np.ndarray:
    """Logits [N, V] -> llama.cpp's records uint16 [N, nv] (its log_softmax, to the bit where float32 allows)."""
    x = logits.float()
    top = x.max(-1, keepdim=True).values
    low = torch.maximum(x.min(-1, keepdim=True).values, top - 16)
    lse = torch.log(torch.exp(x - top).double().sum(-1, keepdim=True)).float()
    min_log_prob = low - top - lse
    scale = (top - low) / 65535
    q = torch.where(x > low, torch.round((x - low) / torch.where(scale > 0, scale, 1)), 0).to(torch.int32)
    n, v = x.shape
    out = np.zeros((n, 2 * ((v + 1) // 2) + 4), dtype=np.uint16)
    out[:, :4] = torch.cat([scale, min_log_prob], 1).numpy().view(np.uint16)
    out[:, 4:4 + v] = q.numpy().astype(np.uint16)
    return out


def decode_logprobs(records: np.ndarray, n_vocab: int) -> torch.Tensor:
    head = records[:, :4].copy().view(np.float32)  # [N, 2]: scale, min_log_prob
    return torch.from_numpy(records[:, 4:4 + n_vocab].astype(np.float32) * head[:, :1] + head[:, 1:2])


SETTINGS = {  # name -> Engine options
    "default": {},
    "float32": {"dtype": "float32"},  # the file's weights as they are, float32 activations, residual and KV
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
    "bf16 dense": {"quantization": "none"},
    "float32 dense": {"quantization": "none", "dtype": "float32"},
}


def chunk_tokens(tok, tokens: list[int] | None, ctx: int, chunks: int) -> list[list[int]]:
    """The chunks every system evaluates: llama.cpp's tokens where it ran, else the reference tokenizer's
    (``tok``); the first token of a chunk is the BOS a text prompt starts with (prompt_bos), as llama-perplexity
    puts it there."""
    if tokens is None:
        with open(TEXT) as f:
            tokens = tok(f.read(), add_special_tokens=False)["input_ids"]
    if len(tokens) < ctx * chunks:
        raise SystemExit(f"the text has {len(tokens)} tokens, fewer than {chunks} chunks of {ctx}")
    out = [list(tokens[i * ctx:(i + 1) * ctx]) for i in range(chunks)]
    bos = prompt_bos(tok)
    if bos is not None:
        for c in out:
            c[0] = bos
    return out


def prompt_bos(tok) -> int | None:
    """The BOS a text prompt starts with, as the served tokenizer encodes one (Engine.encode_prompt): Gemma's
    <bos>, whose file says nothing of add_bos_token (llama.cpp adds it by the tokenizer's type), none for Qwen2
    or SmolLM2."""
    first = tok("a")["input_ids"][0]
    return first if tok.bos_token_id is not None and first == tok.bos_token_id else None


def reference_logprobs(path: str, chunks: list[list[int]], folder: str) -> tuple[list[str], str]:
    """transformers, float32, on the dequantized GGUF -> (per chunk a .npy of the scored positions' exact log-probs
    [ctx/2 - 1, V] float32, kept on disk: 40 chunks of a 152k vocabulary are 6 GB; llama.cpp's base file of them)."""
    model = hf_model(path)
    first, files, base = len(chunks[0]) // 2, [], os.path.join(folder, "reference.kld")
    with open(base, "wb") as out, torch.inference_mode():
        out.write(MAGIC + np.array([len(chunks[0]), model.config.vocab_size, len(chunks)], dtype=np.int32).tobytes())
        out.write(np.array(chunks, dtype=np.int32).tobytes())
        for i, c in enumerate(chunks):
            logits = model(torch.tensor([c])).logits[0, first:-1].float()
            files.append(os.path.join(folder, f"reference-{i}.npy"))
            np.save(files[-1], torch.log_softmax(logits, dim=-1).numpy())
            out.write(encode_logprobs(logits).tobytes())
    return files, base


class RadixlmRun:
    """One setting's engine: each chunk from an empty cache through the engine's ModelRunner (fused layers,
    kernels, KV pool, as a served prompt's prefill) -> the scored positions' logits."""

    def __init__(self, path: str, options: dict, ctx: int) -> None:
        from radixlm.runtime.config import EngineConfig
        from radixlm.runtime.core import EngineCore

        self.core = EngineCore(EngineConfig.from_flat(model=path, max_total_tokens=ctx + 16, chunked_prefill_size=ctx,
                                                      **options), progress=False)
        runner, page = self.core.runner, self.core.config.cache.page_size
        self.row = runner.req_to_token.alloc()
        pages = runner.allocator.alloc_pages(ctx // page)
        self.slots = torch.tensor([p * page + k for p in pages for k in range(page)])
        runner.req_to_token.table[self.row, :ctx] = self.slots
        self.quantization = self.core.config.load.quantization

    def logits(self, chunk: list[int]) -> torch.Tensor:
        from radixlm.runtime.batch import ForwardBatch

        ctx = len(chunk)
        batch = ForwardBatch("extend", torch.tensor(chunk), torch.arange(ctx), self.slots, torch.tensor([self.row]),
                             [ctx], [ctx], torch.arange(ctx // 2, ctx - 1))
        return self.core.runner.forward(batch)


def llama_perplexity(binary: str, path: str, args: argparse.Namespace, *extra: str) -> str:
    cmd = [binary, "-m", path, "-c", str(args.ctx), "-b", str(args.ctx), "-t", str(torch.get_num_threads()), *extra]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"llama-perplexity failed ({run.returncode}): {run.stderr[-2000:]}")
    return run.stdout + run.stderr


def llamacpp_scores(binary: str, path: str, args: argparse.Namespace, base: str) -> dict:
    """llama-perplexity --kl-divergence against the reference's base file -> its printed statistics."""
    text = llama_perplexity(binary, path, args, "--kl-divergence-base", base, "--kl-divergence")

    def value(label: str) -> float:
        m = re.search(rf"^{re.escape(label)}\s*:\s*(-?[0-9.]+)", text, re.MULTILINE)
        if m is None:
            raise SystemExit(f"llama-perplexity printed no {label!r}: {text[-2000:]}")
        return float(m.group(1))

    return {"kld_mean": value("Mean    KLD"), "kld_p99": value("99.0%   KLD"), "kld_median": value("Median  KLD"),
            "top1_agreement": value("Same top p") / 100, "p_diff_mean": value("Mean    Δp") / 100,
            "perplexity": value("Mean PPL(Q)")}


class Stats:
    """One system's statistics against the reference, computed as llama-perplexity computes them (its log_softmax
    against a base record), from the system's exact logits."""

    def __init__(self) -> None:
        self.kld: list[np.ndarray] = []
        self.same_top = self.count = 0
        self.top_delta = self.nll = self.p_diff = 0.0

    def add(self, base: torch.Tensor, ref: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """base: the reference's stored log-probs [N, V]; ref: its exact ones; logits: the system's [N, V]."""
        base, lp = base.double(), torch.log_softmax(logits.double(), -1)
        self.kld.append(torch.where(base > -16, base.exp() * (base - lp), 0).sum(-1).numpy())
        self.same_top += int((lp.argmax(-1) == base.argmax(-1)).sum())
        tok = targets[:, None]
        self.p_diff += float((lp.gather(1, tok).exp() - base.gather(1, tok).exp()).sum())
        self.nll -= float(lp.gather(1, tok).sum())
        self.add_top_delta(ref, lp)
        self.count += len(targets)

    def add_top_delta(self, ref: torch.Tensor, lp: torch.Tensor) -> None:
        top = ref.argmax(-1)[:, None]
        self.top_delta += float((lp.gather(1, top) - ref.double().gather(1, top)).sum())

    def summary(self) -> dict:
        kld = np.concatenate(self.kld)
        return {"positions": self.count, "kld_mean": float(kld.mean()), "kld_p99": float(np.percentile(kld, 99)),
                "kld_median": float(np.median(kld)), "top1_agreement": self.same_top / self.count,
                "p_diff_mean": self.p_diff / self.count, "top_token_logprob_delta": self.top_delta / self.count,
                "perplexity": float(np.exp(self.nll / self.count))}


def compare(args: argparse.Namespace, path: str, folder: str) -> dict:
    """The reference, then each system against it -> {system: its statistics}."""
    saved = None
    if args.llama_perplexity:  # llama.cpp's tokens of the text, and its log-probs
        saved = os.path.join(folder, "llamacpp.kld")
        llama_perplexity(args.llama_perplexity, path, args, "-f", TEXT, "--chunks", str(args.chunks),
                         "--kl-divergence-base", saved)
    chunks = chunk_tokens(hf_tokenizer(path), read_tokens(saved) if saved else None, args.ctx, args.chunks)
    targets = [torch.tensor(c[args.ctx // 2 + 1:]) for c in chunks]
    t = time.perf_counter()
    reference, base = reference_logprobs(path, chunks, folder)
    print(f"reference: {len(chunks)} chunks in {time.perf_counter() - t:.0f} s", flush=True)
    results = {}
    for name in args.settings:
        run, stats = RadixlmRun(path, SETTINGS[name], args.ctx), Stats()
        for ref, b, c, tgt in zip(reference, read_logprobs(base), chunks, targets, strict=True):
            stats.add(b, torch.from_numpy(np.load(ref)), run.logits(c), tgt)
        results[f"radixlm {name} ({run.quantization})"] = stats.summary()
        del run
    if saved is not None:
        results["llama.cpp"] = llamacpp_scores(args.llama_perplexity, path, args, base)
        top = Stats()
        for ref, lp in zip(reference, read_logprobs(saved), strict=True):
            top.add_top_delta(torch.from_numpy(np.load(ref)), lp.double())
            top.count += len(lp)
        results["llama.cpp"]["top_token_logprob_delta"] = top.top_delta / top.count
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file or a catalog name")
    ap.add_argument("--settings", nargs="+", default=["default", "float32"], choices=list(SETTINGS))
    ap.add_argument("--llama-perplexity", default=None, help="llama.cpp's llama-perplexity (benchmarks/peers)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = resolve_model(args.model).path
    with tempfile.TemporaryDirectory(prefix="radixlm-fidelity-") as folder:
        results = compare(args, path, folder)
    print(f"{os.path.basename(path)}, {args.chunks} chunks of {args.ctx}, {cpu_description()}")
    print(f"{'system':32} {'KLD mean':>9} {'KLD p99':>9} {'top-1':>7} {'Δp':>8} {'Δ top lp':>9} {'PPL':>8}")
    for name, s in results.items():
        print(f"{name:32} {s['kld_mean']:9.5f} {s['kld_p99']:9.5f} {100 * s['top1_agreement']:6.2f}% "
              f"{100 * s['p_diff_mean']:7.3f}% {s['top_token_logprob_delta']:9.5f} {s['perplexity']:8.4f}")
    save_result(args.out, benchmark="fidelity", model=os.path.basename(path), ctx=args.ctx, chunks=args.chunks,
                results=results, command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
