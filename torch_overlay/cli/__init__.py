"""``python -m torch_overlay``: ``status``, ``verify`` and ``run``."""
