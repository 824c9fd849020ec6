"""The Textual chat app (`hearth`, `hearth chat`).  Importing this package imports Textual but no engine:
the model loads in a worker after the first paint."""
