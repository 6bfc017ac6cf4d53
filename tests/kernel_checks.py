"""Each Triton kernel against its torch reference, over dtypes, head dims, page sizes and pool layouts (the
attention kernels: every combination natively, a pairwise cover of them under the interpreter).

Run in a subprocess: ``TRITON_INTERPRET=1 python kernel_checks.py NAME[,NAME...] cpu`` on the CPU (Triton's
interpreter), or ``python kernel_checks.py NAME cuda`` natively. Prints "ok NAME" for each check whose every
case passes, "FAILED NAME" and its traceback (on stderr) for the others, and exits nonzero if one failed.
"""

from __future__ import annotations

import sys
import traceback

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ATOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def attention_grid(dev: str) -> list[tuple[torch.dtype, int, int]]:
    """(dtype, head dim, page size) cases for the attention kernels: every combination on a GPU. Under the
    interpreter (each block a NumPy program, so a case costs seconds) a cover of every dtype, and of every head
    dim with every page size."""
    if dev != "cpu":
        return [(dtype, d, page) for dtype in DTYPES for d in (64, 128) for page in (1, 4)]
    return [(torch.float32, 64, 1), (torch.float32, 128, 4), (torch.float16, 128, 1), (torch.bfloat16, 64, 4)]


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=ATOL[dtype], rtol=ATOL[dtype], msg=what)


def paged_table(seq_lens: list[int], page: int, num_pages: int, gen: torch.Generator, shared: int = 0):
    """A request->slot table whose rows use random pages; the first ``shared`` positions (a whole number of
    pages) point at the same slots in every row, as radix-cache prefix sharing does."""
    table = torch.zeros(len(seq_lens) + 1, max(seq_lens) + page, dtype=torch.int64)
    pages = torch.randperm(num_pages - 1, generator=gen) + 1  # page 0 reserved
    shared_pages, nxt = pages[: shared // page], shared // page
    for r, n in enumerate(seq_lens):
        need = -(-n // page)
        own = pages[nxt: nxt + need - len(shared_pages)]
        nxt += len(own)
        mine = torch.cat([shared_pages, own])
        pos = torch.arange(need * page)
        table[r + 1, : need * page] = mine[pos // page] * page + pos % page
    return table


def check_store_kv(dev: str) -> None:
    from radixlm.kernels.store_kv import store_kv_torch, store_kv_triton

    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for d in (64, 128):
            for head_major in (True, False):
                shape = (2, 40, d) if head_major else (40, 2, d)
                bufs = [torch.zeros(shape, dtype=dtype) for _ in range(4)]
                loc = torch.randperm(39, generator=gen)[:7] + 1
                k = torch.randn(7, 2, d, generator=gen).to(dtype)
                v = torch.randn(7, 3, d, generator=gen).to(dtype)[:, 1:]  # strided, as a slice of fused qkv
                store_kv_torch(bufs[0], bufs[1], loc, k, v, head_major)
                got = [b.to(dev) for b in bufs[2:]]
                store_kv_triton(got[0], got[1], loc.to(dev), k.to(dev), v.to(dev), head_major)
                assert torch.equal(got[0].cpu(), bufs[0]) and torch.equal(got[1].cpu(), bufs[1]), (dtype, d)


def check_rmsnorm(dev: str) -> None:
    from radixlm.kernels.rmsnorm import rmsnorm_torch, rmsnorm_triton

    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for h in (64, 576):
            x, r = torch.randn(5, h, generator=gen).to(dtype), torch.randn(5, h, generator=gen).to(dtype)
            w = (torch.rand(h, generator=gen) + 0.5).to(dtype)
            want = rmsnorm_torch(x, w, 1e-5)
            close(rmsnorm_triton(x.to(dev), w.to(dev), 1e-5), want, dtype, f"rmsnorm {dtype} {h}")
            want_o, want_r = rmsnorm_torch(x, w, 1e-5, r)
            got_o, got_r = rmsnorm_triton(x.to(dev), w.to(dev), 1e-5, r.to(dev))
            close(got_r, want_r, dtype, f"residual sum {dtype}")  # bf16: the interpreter may round differently
            close(got_o, want_o, dtype, f"rmsnorm+residual {dtype} {h}")


def check_rotary(dev: str) -> None:
    from radixlm.kernels.rotary import rotary_torch, rotary_triton
    from radixlm.runtime.model.rotary import RotaryEmbedding

    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for d in (64, 128):
            rope = RotaryEmbedding(d, 256, 10000.0, None)
            pos = torch.randint(0, 256, (6,), generator=gen)
            q, k = torch.randn(6, 4, d, generator=gen).to(dtype), torch.randn(6, 2, d, generator=gen).to(dtype)
            want_q, want_k = rotary_torch(pos, q, k, rope.cos, rope.sin)
            ref_q, ref_k = rope.at(pos, dtype)(q, k)  # the model's CPU path (in the model dtype) agrees
            close(ref_q, want_q, dtype, f"model rotary q {dtype} {d}")
            close(ref_k, want_k, dtype, f"model rotary k {dtype} {d}")
            got_q, got_k = rotary_triton(pos.to(dev), q.clone().to(dev), k.clone().to(dev), rope.cos.to(dev),
                                         rope.sin.to(dev))
            close(got_q, want_q, dtype, f"rotary q {dtype} {d}")
            close(got_k, want_k, dtype, f"rotary k {dtype} {d}")


def attention_case(dtype, d: int, page: int, head_major: bool, gen: torch.Generator):
    seq_lens, hkv = [37, 70, 9], 2
    num_pages = 120 // page + 4
    table = paged_table(seq_lens, page, num_pages, gen, shared=8 if page in (1, 4) else 0)
    slots = num_pages * page
    shape = (hkv, slots, d) if head_major else (slots, hkv, d)
    k_buf, v_buf = torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)
    rows = torch.arange(1, len(seq_lens) + 1)
    return table, k_buf, v_buf, rows, torch.tensor(seq_lens)


def check_extend_attention(dev: str) -> None:
    from radixlm.kernels.extend_attention import extend_attention_torch, extend_attention_triton

    gen = torch.Generator().manual_seed(0)
    for dtype, d, page in attention_grid(dev):
        head_major = page == 1
        table, k_buf, v_buf, rows, seqs = attention_case(dtype, d, page, head_major, gen)
        ext = torch.tensor([37, 5, 1])  # a fresh prompt, a chunk over a prefix, a decode-like row
        q = torch.randn(int(ext.sum()), 8, d, generator=gen).to(dtype)
        want = extend_attention_torch(q, k_buf, v_buf, table, rows, seqs, ext, d ** -0.5, head_major)
        got = extend_attention_triton(*(t.to(dev) for t in (q, k_buf, v_buf, table, rows, seqs, ext)),
                                      d ** -0.5, head_major, block_m=16, block_n=16)
        close(got, want, dtype, f"extend {dtype} d={d} page={page}")


def check_decode_attention(dev: str) -> None:
    from radixlm.kernels.decode_attention import decode_attention_torch, decode_attention_triton

    gen = torch.Generator().manual_seed(0)
    for dtype, d, page in attention_grid(dev):
        head_major = page == 4
        table, k_buf, v_buf, rows, seqs = attention_case(dtype, d, page, head_major, gen)
        q = torch.randn(len(seqs), 8, d, generator=gen).to(dtype)
        want = decode_attention_torch(q, k_buf, v_buf, table, rows, seqs, d ** -0.5, head_major)
        got = decode_attention_triton(*(t.to(dev) for t in (q, k_buf, v_buf, table, rows, seqs)),
                                      d ** -0.5, head_major, num_splits=4, block_n=16)
        close(got, want, dtype, f"decode {dtype} d={d} page={page}")


def check_attention_invariance(dev: str) -> None:
    """The extend kernel at the backend's block sizes gives a query the same bits whether its sequence is
    extended whole, in chunks over a cached prefix, or one token at a time (decode), alone or batched."""
    from radixlm.kernels.extend_attention import extend_attention_triton

    gen = torch.Generator().manual_seed(3)
    for dtype in DTYPES:
        table, k_buf, v_buf, rows, seqs = attention_case(dtype, 64, 4, False, gen)
        k_buf, v_buf, table = k_buf.to(dev), v_buf.to(dev), table.to(dev)
        n = int(seqs[1])  # request 2 (70 tokens); the others ride along in the batch
        q = torch.randn(n, 8, 64, generator=gen).to(dtype).to(dev)

        def attend(qs, rws, lens, exts, kv=(k_buf, v_buf, table)):
            t = lambda xs: torch.tensor(xs, device=dev)  # noqa: E731
            return extend_attention_triton(qs, *kv, t(rws), t(lens), t(exts), 0.125, False)

        whole = attend(q, [2], [n], [n])
        chunks = torch.cat([attend(q[a:a + 24], [2], [min(a + 24, n)], [min(24, n - a)]) for a in range(0, n, 24)])
        assert torch.equal(chunks, whole), f"chunked {dtype}"
        other = torch.randn(5, 8, 64, generator=gen).to(dtype).to(dev)
        for pos in (0, 31, 32, n - 1):
            alone = attend(q[pos:pos + 1], [2], [pos + 1], [1])
            batched = attend(torch.cat([other[:4], q[pos:pos + 1], other[4:]]), [1, 2, 3], [33, pos + 1, 9],
                             [4, 1, 1])
            assert torch.equal(alone, whole[pos:pos + 1]) and torch.equal(batched[4:5], alone), (dtype, pos)


def check_engine(dev: str) -> None:
    """The GPU backends end to end: a tiny model's greedy tokens equal the CPU torch backend's, with chunked
    prefill over a cached prefix and page sizes 1 and 4 (on CUDA also through the decode CUDA graphs)."""
    import importlib.util

    from radixlm.runtime.config import ModelConfig
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.loader import random_model

    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=True)
    model = random_model(cfg, torch.float32, seed=0)
    gen = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 256, (40,), generator=gen).tolist()
    prompts = [shared + torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 30, 17)]
    sp = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    backends = [("torch", "cpu"), ("triton", dev)]
    if dev == "cuda" and importlib.util.find_spec("flashinfer") is not None:
        backends.append(("flashinfer", dev))
    for page in (1, 4):
        outs = {}
        for backend, device in backends:
            engine = Engine.from_model(model.to(device), attention_backend=backend, page_size=page,
                                       chunked_prefill_size=24, max_total_tokens=2048, check_invariants=True)
            first = engine.generate(input_ids=prompts[0], sampling_params=sp)  # caches the shared prefix
            rest = engine.generate(input_ids=prompts[1:], sampling_params=sp)
            assert all(r["meta_info"]["cached_tokens"] >= 40 - page for r in rest)
            outs[backend] = [first["output_ids"]] + [r["output_ids"] for r in rest]
        assert all(o == outs["torch"] for o in outs.values()), (page, outs)
        print(f"page {page}: {', '.join(outs)} agree")


CHECKS = {"engine": check_engine, "store_kv": check_store_kv, "rmsnorm": check_rmsnorm, "rotary": check_rotary,
          "extend_attention": check_extend_attention, "decode_attention": check_decode_attention,
          "attention_invariance": check_attention_invariance}


def main(names: list[str], device: str) -> int:
    """Each check in turn (one process: torch and Triton imported once); the number that failed."""
    failed = 0
    for name in names:
        try:
            CHECKS[name](device)
            print(f"ok {name}", flush=True)
        except Exception:
            failed += 1
            print(f"FAILED {name}", flush=True)
            print(f"--- {name}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1].split(","), sys.argv[2] if len(sys.argv) > 2 else "cpu") else 0)
