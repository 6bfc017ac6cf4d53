"""OpenAI's routes and their request models: chat completions, completions, models (routes.py), the shared
model check and sampling parameters (params.py), the request models (protocol.py)."""
