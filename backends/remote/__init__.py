"""The remote backend: a model on any OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp's server,
another hearth), spoken to over HTTP with httpx.  No native code, so it runs in hearth's own process."""
