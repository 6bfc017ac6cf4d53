"""radixlm.kernels: one op per file beside its torch reference; GPU imports (triton) are lazy.

token_bitmask: grammar masks on logits; store_kv: K/V into the paged pool; extend_attention and
decode_attention: attention over the pool; rmsnorm: fused residual add + RMSNorm; rotary: RoPE in place.
The package itself imports nothing: ``radixlm.kernels.cpu_info`` (cpuid, no torch) serves processes that
never run a kernel.
"""

from __future__ import annotations

__all__ = ["apply_token_bitmask", "apply_token_bitmask_torch"]


def __getattr__(name: str):
    if name in __all__:
        from radixlm.kernels import token_bitmask

        return getattr(token_bitmask, name)
    raise AttributeError(f"module 'radixlm.kernels' has no attribute {name!r}")
