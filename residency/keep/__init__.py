"""Keeping the planned prefixes resident while the router serves: one keeper (`keeper`) that
warms an upstream as it joins and then keeps its prefixes cached from two sources, the engine's
KV events (`kv_residency`, over a `block_index` of each upstream's stored blocks) and the token
count (`token_count`), with the agent's metrics (`agent_metrics`).

May import: planner, the cross-cutting modules, planning, warm.
"""
