"""radixlm.kernels: one op per file beside its torch reference; GPU imports are lazy."""

from radixlm.kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_torch

__all__ = ["apply_token_bitmask", "apply_token_bitmask_torch"]
