"""radixlm.kernels: one op per file beside its torch reference; GPU imports (triton) are lazy.

token_bitmask: grammar masks on logits; store_kv: K/V into the paged pool; extend_attention and
decode_attention: attention over the pool; rmsnorm: fused residual add + RMSNorm; rotary: RoPE in place.
"""

from radixlm.kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_torch

__all__ = ["apply_token_bitmask", "apply_token_bitmask_torch"]
