"""Tianshou's numba kernels compiled once per machine, not once per process.

Tianshou 2.0 jit-compiles its buffer-index and return kernels (``ReplayBufferManager``'s
``_prev_index`` / ``_next_index``, ``_gae``, ``_nstep_return``, the segment tree's) with ``@njit`` and
no on-disk cache, so every new process pays the compilation when it builds its first vector buffer
and algorithm: many times what loading them from numba's cache costs (the measurement is in the docs'
lab notebook, "Measurements behind constants in the code"). Every
``rlaccel bench`` variant, Ray actor and resumed run is a new process.

:func:`cache_tianshou_kernels` turns numba's own cache on for those kernels (``Dispatcher.enable_caching``,
what ``@njit(cache=True)`` does): the same compiled code, stored where numba stores its caches
(``__pycache__`` beside Tianshou's modules, or ``NUMBA_CACHE_DIR``) and invalidated by numba when
Tianshou's source changes. The rlaccel_tianshou modules that import Tianshou call it;
``RLACCEL_NUMBA_CACHE=0`` leaves Tianshou's kernels as they are.

Examples:
    >>> from tianshou.data.buffer import manager
    >>> cache_tianshou_kernels() and manager._prev_index._cache.__class__.__name__
    'FunctionCache'
"""

from __future__ import annotations

import functools
import os


@functools.cache
def cache_tianshou_kernels() -> bool:
    """Let numba cache Tianshou's jitted kernels on disk (once per process); whether it does."""
    return os.environ.get("RLACCEL_NUMBA_CACHE", "1") != "0" and _enable()


def _enable() -> bool:
    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher
    from tianshou.algorithm import algorithm_base
    from tianshou.data.buffer import manager
    from tianshou.data.utils import segtree

    kernels = [value for module in (algorithm_base, manager, segtree) for value in vars(module).values()
               if isinstance(value, Dispatcher)]
    try:
        for kernel in kernels:
            # a kernel compiled already keeps its in-memory code; one with a cache of its own keeps it
            if isinstance(kernel._cache, NullCache):
                kernel.enable_caching()
    except RuntimeError:  # numba found no writable cache location: Tianshou compiles as before
        return False
    return bool(kernels)
