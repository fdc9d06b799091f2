"""`residency serve`: the OpenAI-compatible router in front of vLLM (request path: router.py)."""
