"""The runtime agent (`turnout agent`): one engine process per model claim on a GPU pod.

Supervises engines (vLLM, SGLang, llama.cpp) as process groups, restarts crashed ones with backoff,
persists a registry so a restarted agent re-adopts live engines, reads kvcached segments for KV usage,
and serves an HTTP API the controller drives.
"""
