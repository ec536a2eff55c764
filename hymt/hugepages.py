"""Weights in transparent huge pages (Linux): the page-cache side of decode speed.

Decoding one token streams every weight once. Over 4 KiB pages that is a TLB miss and a page walk per 4 KiB,
and the hardware prefetchers stop at every page edge: on the 1.25Bit model the same kernels decode about
25 % slower over 4 KiB pages than over 2 MiB pages (docs/benchmarks.md). Linux maps a file with 2 MiB entries
when the page cache holds it in 2 MiB folios (recent kernels do so for ext4, xfs, btrfs and tmpfs when it
reads a file in) and the mapping is 2 MiB aligned (the kernel aligns large file mappings). But the cache keeps
whatever folios a file already has, and a file written in small or unaligned pieces (a download, a copy, our
own writer) can sit in small folios until evicted, which may be never on a machine with free memory.

So a reader of a large file calls ``map_in_huge_pages`` once: it asks for huge pages, samples a few 2 MiB
regions, and if they come back in 4 KiB pages it checks on one region that a re-read gives 2 MiB pages and,
only then, drops the file's cached pages so that the first use reads it back in huge folios (one read from
disk, once). Pages other processes map are never dropped. Everything here is best effort: elsewhere, or when
the kernel cannot, nothing changes but speed.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

HUGE_PAGE_BYTES = 2 * 1024 * 1024
MIN_FILE_BYTES = 32 * 1024 * 1024  # below this, TLB reach covers the file anyway
SAMPLE_REGIONS = 4


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
    samples = sorted(
        {(i * (regions - 1) // (SAMPLE_REGIONS - 1)) * HUGE_PAGE_BYTES for i in range(SAMPLE_REGIONS)}
    )
    for offset in samples:
        int(view[offset])  # fault the region in
    before = mapped_huge_bytes(path)
    if before is None or before >= len(samples) * HUGE_PAGE_BYTES:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        # One region first: unmap it here, drop it from the cache, read it back. Only if that gives a 2 MiB
        # page is it worth re-reading the whole file (kernels or filesystems without large folios never do).
        probe = samples[len(samples) // 2]
        os.fsync(fd)  # a file still being written back has dirty pages, which cannot be dropped
        mapping.madvise(mmap.MADV_DONTNEED, probe, HUGE_PAGE_BYTES)
        os.posix_fadvise(fd, probe, HUGE_PAGE_BYTES, os.POSIX_FADV_DONTNEED)
        int(view[probe])
        after = mapped_huge_bytes(path)
        if after is None or after <= before:
            return False
        mapping.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
