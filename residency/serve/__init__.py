"""The serve stage, `residency serve`: the OpenAI-compatible router in front of vLLM. Owns the
request path (`router`), the upstream pool, metrics, the residency picture it serves
(`status_view`) and the query log it appends (which the plan stage reads back); each request's
context (retrieve, route, pin dated sections, prune, assemble, headers) comes from `context`.

May import: planner, the cross-cutting modules, context, corpus, index, keep, planning,
retrieval, status, timex, warm.
"""
