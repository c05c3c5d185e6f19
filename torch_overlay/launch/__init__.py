"""The launcher and its bootstrap: every Python process of a job imports torch_overlay first."""
