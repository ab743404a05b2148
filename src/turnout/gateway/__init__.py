"""The client-facing HTTP server: OpenAI `/v1` and Ollama `/api` dialects on one port."""
