"""The HTTP API process: routes (app.py, openai_routes.py, native.py), the OpenAI request models
(protocol.py), request handling and SSE (serving.py), tools (tools.py), the tokenizer manager that talks to
the scheduler over ZeroMQ (tokenizer_manager.py), and Prometheus metrics (metrics.py). No model code here."""
