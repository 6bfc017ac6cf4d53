"""radixlm.constrained: grammar-constrained decoding (lands with its own issue)."""
