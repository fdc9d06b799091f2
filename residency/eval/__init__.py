"""The eval stage, `residency eval`: retrieval (recall, MRR, nDCG, history and budgets:
`retrieval`), coverage of a plan or of every strategy on simulated traffic (`coverage`,
`traffic`, `coverage_runs`), the pruner (`prune`) and answers (`answers`), all on question sets
read by one reader (`questions`).

May import: planner, the cross-cutting modules, context, corpus, index, models, planning,
retrieval, timex.
"""
