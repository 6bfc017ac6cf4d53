"""radixlm.lang: the frontend language (lands with its own issue)."""
