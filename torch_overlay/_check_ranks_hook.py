"""Placeholder replaced when check_ranks lands."""


def install() -> None:
    pass
