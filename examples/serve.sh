#!/usr/bin/env bash
# Serve the embedded model on 127.0.0.1:30000 with the flags that matter most.
exec radixlm serve --host 127.0.0.1 --port 30000 --dtype bfloat16 --max-running-requests 64 \
  --chunked-prefill-size 1024 --schedule-policy lpm "$@"
