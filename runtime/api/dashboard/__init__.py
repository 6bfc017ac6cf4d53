"""The live radix-cache dashboard and the chat playground: their routes and JSON API (routes.py), the
one-second series (live_series.py) and the static pages (static/)."""
