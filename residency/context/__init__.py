"""The question-to-context pipeline, shared by the router (`residency serve`) and the
evaluations (`residency eval coverage`, `eval answers`, `eval prune`), so both put the same text
in front of the model for the same question: route a question over the whole-corpus ranking
(`routing`), search with the chosen retriever (`retriever`), build the per-request context
(`builder`: the prefix, the long-tail chunks, the dated sections, the second hop), prune it
(`pruner`, `pruner_settings`), assemble the chat messages (`prompt`), and name what was chosen
in the router's response headers (`headers`). One settings model (`settings.ContextSettings`)
holds the knobs; no upstreams, no host or port.

May import: planner, the cross-cutting modules, corpus, index, planning, retrieval, timex.
"""
