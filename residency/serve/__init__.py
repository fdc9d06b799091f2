"""The serve stage, `residency serve`: the OpenAI-compatible router in front of vLLM. Owns the
request path (`router`), the per-request context (retrieve, route, pin dated sections, prune:
`context`, `pruner`), prompt assembly, the upstream pool, the response headers, metrics and the
query log it appends (which the plan stage reads back).

May import: planner, the cross-cutting modules, corpus, index, keep, planning, retrieval, timex,
warm.
"""
