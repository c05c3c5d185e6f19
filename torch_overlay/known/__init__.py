"""Known bugs as data: each fix's and each looked-at report's error signatures, and what they mean.

``explain`` (``torch-overlay explain LOG``) matches the errors of a traceback or job log against
them; ``hint`` prints one line after an uncaught exception whose fix is not active in the process.
Nothing here imports torch.
"""
