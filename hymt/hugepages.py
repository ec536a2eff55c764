"""Weights in transparent huge pages (Linux): the page-cache side of decode speed.

Decoding one token streams every weight once. Over 4 KiB pages that is a TLB miss and a page walk per 4 KiB,
and the hardware prefetchers stop at every page edge: on the 1.25Bit model the same kernels decode about
25 % slower over 4 KiB pages than over 2 MiB pages (docs/benchmarks.md). Linux maps a file with 2 MiB entries
when the page cache holds it in 2 MiB folios (recent kernels do so for ext4, xfs, btrfs and tmpfs when it
reads a file in) and the mapping is 2 MiB aligned (the kernel aligns large file mappings). But the cache keeps
whatever folios a file already has, and a file written in small or unaligned pieces (a download, a copy, our
own writer) can sit in small folios until evicted, which may be never on a machine with free memory.

So a reader of a large file calls ``map_in_huge_pages`` once: it asks for huge pages, maps one byte of every
2 MiB region the page cache already holds (``mincore``; regions not cached yet will be read in huge folios) and
counts how many came back in 4 KiB pages. A file can be in that state wholly (written in small pieces) or
partly: regions read back under memory fragmentation, or by a reader that asked for no huge pages, keep small
folios while the rest is huge (one 1.25Bit file here had 17 % of its regions small after a day of use, which
cost its decode step 5-10 %). When more than ``SMALL_SHARE_TO_REREAD`` of the regions are small, it checks on
one small region that a re-read gives a 2 MiB page and, only then, drops the file's cached pages so that the
first use reads it back in huge folios (one read from disk, once). Pages other processes map are never
dropped. Everything here is best effort: elsewhere, or when the kernel cannot, nothing changes but speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import numpy as np

HUGE_PAGE_BYTES = 2 * 1024 * 1024
MIN_FILE_BYTES = 32 * 1024 * 1024  # below this, TLB reach covers the file anyway
PAGE_BYTES = mmap.PAGESIZE
# Re-read the file when more of its 2 MiB regions than this share sit in small pages (each costs its bytes
# about a quarter of their streaming speed; below a few percent a re-read from disk does not pay).
SMALL_SHARE_TO_REREAD = 0.05


def thp_enabled() -> bool:
    """Whether transparent huge pages are on (``always`` or ``madvise``)."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in mode


def mapped_huge_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes of this process's mappings of the file ``path`` now mapped with 2 MiB entries, from
    ``/proc/self/smaps``; ``None`` where that file does not exist."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
            inside = False
            total = 0
            for line in smaps:
                fields = line.split(maxsplit=5)
                if fields and "-" in fields[0] and not fields[0].endswith(":"):  # start-end perms ... path
                    inside = len(fields) == 6 and fields[5].rstrip("\n") == target
                elif inside and fields and fields[0] == "FilePmdMapped:":
                    total += int(fields[1]) * 1024
            return total
    except OSError:
        return None


def _cached_regions(view: np.ndarray, regions: int) -> list[int] | None:
    """Offsets of the whole 2 MiB regions of the mapping ``view`` with any page in the page cache (``mincore``);
    ``None`` where that cannot be asked."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        pages = (regions * HUGE_PAGE_BYTES) // PAGE_BYTES
        residency = np.zeros(pages, np.uint8)  # [pages]: bit 0 set when the page is cached
        status = libc.mincore(
            ctypes.c_void_p(view.ctypes.data),
            ctypes.c_size_t(pages * PAGE_BYTES),
            residency.ctypes.data_as(ctypes.c_void_p),
        )
    except (OSError, AttributeError):
        return None
    if status != 0:
        return None
    cached = (residency.reshape(regions, -1) & 1).any(axis=1)  # [regions]
    return [int(r) * HUGE_PAGE_BYTES for r in np.flatnonzero(cached)]


def _huge_regions(
    mapping: mmap.mmap, view: np.ndarray, path: str | os.PathLike[str], offsets: list[int]
) -> int:
    """How many of the regions at ``offsets`` map in 2 MiB pages: this process's entries for the whole
    mapping are dropped (the page cache keeps the pages), then one byte of each region is read back."""
    mapping.madvise(mmap.MADV_DONTNEED)
    for offset in offsets:
        int(view[offset])
    return min(len(offsets), (mapped_huge_bytes(path) or 0) // HUGE_PAGE_BYTES)


def map_in_huge_pages(mapping: mmap.mmap, path: str | os.PathLike[str]) -> bool:
    """Arrange for the read-only file mapping ``mapping`` of ``path`` to be served from 2 MiB pages; returns
    whether its cached pages were dropped to that end (the next touches read the file from disk)."""
    size = len(mapping)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if size < MIN_FILE_BYTES or advice is None or not hasattr(os, "posix_fadvise") or not thp_enabled():
        return False
    try:
        mapping.madvise(advice)
    except OSError:
        return False
    view = np.frombuffer(mapping, np.uint8)  # [size], read-only
    if view.ctypes.data % HUGE_PAGE_BYTES:
        return False  # the kernel did not align the mapping: it cannot use 2 MiB entries
    regions = size // HUGE_PAGE_BYTES  # whole 2 MiB regions of the file
    cached = _cached_regions(view, regions)
    if not cached:
        return False  # nothing cached (or no way to ask): first touches read the file in huge folios
    try:
        huge = _huge_regions(mapping, view, path, cached)
        if len(cached) - huge <= SMALL_SHARE_TO_REREAD * regions:
            return False
        # Find one small region by halving (a few smaps reads), drop it from the cache and read it back: only
        # if that gives a 2 MiB page is it worth re-reading the whole file (kernels or filesystems without
        # large folios never do).
        candidates = cached
        while len(candidates) > 1:
            half = candidates[: len(candidates) // 2]
            candidates = (
                half if _huge_regions(mapping, view, path, half) < len(half) else candidates[len(half) :]
            )
        probe = candidates[0]
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # a file still being written back has dirty pages, which cannot be dropped
            mapping.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(fd, probe, HUGE_PAGE_BYTES, os.POSIX_FADV_DONTNEED)
            if _huge_regions(mapping, view, path, [probe]) < 1:
                return False
            mapping.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return True
        finally:
            os.close(fd)
    except OSError:
        return False
