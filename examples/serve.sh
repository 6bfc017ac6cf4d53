#!/usr/bin/env bash
# Serve the embedded model on 127.0.0.1:30000 with the flags that matter most (the defaults: the Q4_1 file's
# layers stay int4 on radixlm's fused CPU layers, batch- and cache-invariant).
exec radixlm serve --host 127.0.0.1 --port 30000 --max-running-requests 64 \
  --chunked-prefill-size 1024 --schedule-policy lpm "$@"
# Other shapes of the same server (pass them as extra flags):
#   --quantization none / int8            dense bf16 weights / int8 weight-only (int4: the file's own precision)
#   --speculative-algorithm ngram         prompt-lookup speculation (extraction, code editing, RAG)
#   --tp-size 2                           tensor parallelism (gloo on the CPU, NCCL on GPUs)
#   --dp-size 2 --router-policy cache_aware   two replicas behind the cache-aware router
#   --device cuda --attention-backend triton  the GPU path (flashinfer if installed: radixlm[gpu])
#   --no-deterministic --cpu-kernels torch    torch's CPU kernels (not batch-invariant)
# A router alone in front of servers elsewhere:
#   radixlm router --worker-urls http://host-a:30000 http://host-b:30000 --port 30000
