"""Keep freed memory in the process heap instead of handing it back to the OS (glibc only).

A pipeline stage allocates and frees the same large tensors every micro-batch: activations and
their gradients (256 KiB on the mlp of `benchmarks/pipeline_torch.py`) and, in every backward, the
weight gradient of each layer (4 MiB for a 1024x1024 Linear), which is summed into ``.grad`` and
freed. With glibc's defaults a block that large is either mapped afresh (above the adaptive mmap
threshold) or, freed at the top of the heap, trimmed back to the OS — and the next allocation
page-faults its pages in again and zeroes them, on the cores the stages compute on. Measured with
`benchmarks/pipeline_profile.py` (2 stages on 2 cores): about a thousand minor faults per step,
nearly all inside backward, which run 5–15% slower than the same backward in isolation.

`keep_heap` fixes both thresholds: blocks up to 32 MiB (glibc's largest mmap threshold) come from
the heap, and the heap is trimmed only past ``trim_bytes`` of free memory at its top. Steady-state
steps then reuse the memory of the previous ones without a fault. The cost: a stage's resident
memory stays at its peak (as with any caching allocator). ``--set heap=system`` leaves glibc's
defaults; other C libraries (musl, macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
TRIM_BYTES = 1 << 30


def keep_heap(trim_bytes: int = TRIM_BYTES) -> bool:
    """Set glibc's mmap and trim thresholds for this process; False where that is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
        return bool(ok and libc.mallopt(M_TRIM_THRESHOLD, trim_bytes) == 1)
    except (OSError, AttributeError):
        return False
