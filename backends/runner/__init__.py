"""The runner: one child process per loaded model, its typed protocol and its supervision (client.py)."""
