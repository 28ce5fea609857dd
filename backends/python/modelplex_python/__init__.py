"""modelplex's Python backend: Triton's `model.py` models, each instance in a worker process of its own."""
