"""Chat rendering: messages and tools into the template's prompt (prompt.py, tools.py, tool_formats.py), reasoning
markers (reasoning.py), and the answer read back into reasoning, content and tool calls (message_stream.py)."""
