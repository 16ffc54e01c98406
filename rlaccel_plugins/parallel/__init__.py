"""Parallel collection: vectorised environments (envpool when it supports the task, else gymnasium)."""

from rlaccel_plugins.parallel.factory import make_vec_env

__all__ = ["make_vec_env"]
