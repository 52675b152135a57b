"""Tool calling: how tools reach the prompt, the grammar that enforces a required or named call, and how
the output is parsed into calls."""
