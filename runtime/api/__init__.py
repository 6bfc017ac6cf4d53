"""The HTTP API process, grouped by what it serves: the OpenAI routes (openai_api/), chat rendering (chat/), the
Responses API (responses/), the dashboard and playground (dashboard/), SGLang's native /generate (native.py); and
what they share: request handling and SSE (serving.py), the one error type (errors.py), the scheduler's client
over ZeroMQ (scheduler_client.py), detokenization, tenancy, limits and metrics. No model code here."""
