"""The NL2Repo env family."""
