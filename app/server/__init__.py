"""hearth's OpenAI-compatible HTTP API (`hearth serve`): FastAPI on uvicorn, one loaded Backend shared by all
requests.  `create_app(backend, config)` builds the ASGI app; app/commands/serve.py runs it."""
