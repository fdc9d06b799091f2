"""The capacity stage, the first half of `residency plan`: GPU and model profiles (`profiles`), the
live GPU through NVML (`gpu`), and the capacity report (`report`): the pure planner's KV-cache
numbers from a profile, the live GPU, explicit KV bytes or a running vLLM, compared with vLLM's
own. Hands the resident budget to planning.

May import: planner, the cross-cutting modules.
"""
