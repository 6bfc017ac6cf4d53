"""OpenAI's Responses API: the input items as chat messages (input.py), the deltas as output items and events
(routes.py)."""
