"""radixlm.kernels: one op per file beside its torch reference (GPU kernels land with their issue)."""
