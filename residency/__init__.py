"""residency: plan, warm and serve a resident prompt prefix for vLLM hosts."""

__version__ = "0.1.0"
