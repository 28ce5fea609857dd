"""Request scheduling in front of a model's instances: Triton's dynamic batcher (priority queues,
queue policies, timeouts) and the merge and split of batched requests.

Uses `core` and `observability` (statistics); never models, the data plane or a front door.
"""
