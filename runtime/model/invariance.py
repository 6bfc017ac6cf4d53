"""Whether a model runner's forward is batch- and cache-invariant, and if not, why.

Invariant means: the logits of a request's token are bitwise the same whatever else is in its batch (how many
rows, in which order), whether its prefix's KV came from the radix cache, an earlier chunk or the same pass,
with any page size, and whether the token was decoded or verified inside a speculative extend. radixlm's CPU
kernels give that by construction:
  * matmuls (int4, int8, dense): one microkernel whatever M, the reduction over K in a fixed order, no split-K;
  * RMSNorm, silu * up, RoPE: one row at a time;
  * attention: keys in fixed blocks aligned to absolute positions, merged in order, the same code for extend
    and decode (kernels/cpu_attention_body.h); no prefix grouping in decode (plan_decode);
  * the LM head is one of those matmuls, sampling works a row at a time with the request's own generator.
torch's CPU kernels (oneDNN / MKL matmuls, SDPA) choose blockings by shape, so ``--cpu-kernels torch``, a
torch.compile'd step (inductor's kernels differ between the compiled decode and the eager extend) and shapes
or dtypes radixlm's kernels do not take are not invariant; nor is CUDA's path (cuBLAS picks algorithms by M),
though its Triton attention is (kernels/extend_attention.py: tiles aligned to positions, decode through it).
"""

from __future__ import annotations

from radixlm.runtime.model.llama import LlamaForCausalLM

# Why the answer at --tp-size N is not the answer at --tp-size 1, whatever the kernels: a row-parallel layer
# (o_proj, down_proj) sums each rank's partial product over its share of K, and the all-reduce adds the shares;
# one rank's matmul reduces over the whole K in another order, so the bits differ and greedy text may part.
TP_GAP = ("tensor parallelism: each rank reduces its share of a layer's inputs and the all-reduce adds the "
          "shares, another order of the sum than one rank's, so --tp-size N and --tp-size 1 may answer differently")


def invariance_report(gaps: list[str]) -> dict[str, bool]:
    """Invariance per dimension: batch (what else is in the batch), cache (a prefix from the radix cache or
    recomputed), chunking (chunk and page sizes), speculation (on or off) hold together where the runner has no
    gaps; tp (the answer at any --tp-size equals --tp-size 1's) never holds (TP_GAP)."""
    ok = not gaps
    return {"batch": ok, "cache": ok, "chunking": ok, "speculation": ok, "tp": False}


def linear_gaps(model: LlamaForCausalLM) -> list[str]:
    """The linear layers (and embedding / LM head) that run on torch's matmul rather than radixlm's kernels."""
    slow = sorted({type(m).__name__ for m in model.modules()
                   if hasattr(m, "quantize") and (getattr(m, "quant", None) is None or m.quant.backend != "native"
                                                   or m.weight is not None)})
    return [f"{', '.join(slow)}: torch's matmul (shape or dtype outside radixlm's kernels)"] if slow else []


def invariance_gaps(model: LlamaForCausalLM, device: str, cpu_isa: int | None, attention_isa: int | None,
                    compiled: bool) -> list[str]:
    """Why this runner's forward is not batch- and cache-invariant; empty when it is."""
    if device != "cpu":
        return [f"{device}: matmuls on cuBLAS, which picks its algorithm by batch size (the Triton attention "
                "is invariant with --deterministic; FlashInfer's is not)"]
    if cpu_isa is None:
        return ["torch's CPU kernels (--cpu-kernels torch, or no C++ compiler for radixlm's)"]
    gaps = linear_gaps(model)
    if attention_isa is None:
        gaps.append("attention on torch's ops (radixlm's attention takes head dims 64 / 128, float32 / bfloat16)")
    if compiled:
        gaps.append("the torch.compile'd decode step (inductor's kernels, not the eager extend's)")
    return gaps
