"""What `residency status` shows: the residency picture as it crosses HTTP (`model`, the body of
the router's `GET /residency`) and the client that reads it from a running router (`client`).
The router builds the picture (serve/status_view.py) and the router-less reading of a server's
own KV events lives beside the router's parts (serve/direct_status.py).

May import: planner, the cross-cutting modules.
"""
