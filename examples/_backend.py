"""Shared by the examples: the in-process engine by default, or a running server with RADIXLM_URL."""

import os

import radixlm.lang as sgl


def default_backend():
    url = os.environ.get("RADIXLM_URL")
    return sgl.RuntimeEndpoint(url) if url else sgl.EngineBackend()
