"""Checks training code calls: replicas that diverged, ranks that run different fixes."""
