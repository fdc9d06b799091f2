"""The plan stage, `residency plan`: score sections from traffic (the query log), select the
resident set for the capacity budget, render and hash the prefix, write plan.json.

May import: planner, the cross-cutting modules, capacity, corpus, index, models.
"""
