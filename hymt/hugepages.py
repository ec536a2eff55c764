"""Weights in transparent huge pages (Linux): the page-cache side of decode speed.

Decoding one token streams every weight once. Over 4 KiB pages that is a TLB miss and a page walk per 4 KiB,
and the hardware prefetchers stop at every page edge: on the 1.25Bit model the same kernels decode about
25 % slower over 4 KiB pages than over 2 MiB pages (docs/benchmarks.md). Linux maps a file with 2 MiB entries
when the page cache holds it in 2 MiB folios (recent kernels do so for ext4, xfs, btrfs and tmpfs when it
reads a file in) and the mapping is 2 MiB aligned (the kernel aligns large file mappings). But the cache keeps
whatever folios a file already has, and a file written in small or unaligned pieces (a download, a copy, our
own writer) can sit in small folios until evicted, which may be never on a machine with free memory.

So a reader of a large file calls ``map_in_huge_pages`` once: it asks for huge pages and finds the 2 MiB
regions of the file that the page cache holds in small folios: it touches each cached region once through
the mapping and reads from ``/proc/self/smaps`` how much of it the kernel served with 2 MiB entries; when
that is not all, it touches each cached region again through a fresh 2 MiB mapping of its own to see which
(1.25Bit file: ~5 ms when all are huge, ~30 ms with that second step). If some are, it checks on one of
them that a re-read gives a 2 MiB page and, only then, drops those regions' cached pages (the whole file's
when most are small: a freshly written file), so that the first use reads them back in huge folios (one
read from disk, once). Small regions are not only freshly written files: memory reclaim evicts idle parts of
a cached model, and other readers fault them back in small folios. 30 % of the 1.25Bit file's regions
scattered in small folios made its decode step 25.3–25.8 ms against 22.5–22.7 ms once re-read (a check of
four sampled regions, which this replaces, saw none of them). Regions the cache does not hold are not
touched here: they come in through the model's own mapping, which asks for huge pages. Pages other
processes map are never dropped. Everything here is best effort: elsewhere, or when the kernel cannot,
nothing changes but speed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np

HUGE_PAGE_BYTES = 2 * 1024 * 1024
MIN_FILE_BYTES = 32 * 1024 * 1024  # below this, TLB reach covers the file anyway
CHECK_BATCH = 1024  # fresh 2 MiB mappings alive at once while regions are checked


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
    by_address = _mapped_huge_bytes_by_address(path)
    return None if by_address is None else sum(by_address.values())


def map_in_huge_pages(mapping: mmap.mmap, path: str | os.PathLike[str]) -> bool:
    """Arrange for the read-only file mapping ``mapping`` of ``path`` to be served from 2 MiB pages; returns
    whether cached pages (all or some of the file's) were dropped to that end (the next touches read them
    from disk)."""
    size = len(mapping)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if size < MIN_FILE_BYTES or advice is None or not hasattr(os, "posix_fadvise") or not thp_enabled():
        return False
    try:
        mapping.madvise(advice)
    except OSError:
        return False
    address = _address(mapping)
    if address % HUGE_PAGE_BYTES:
        return False  # the kernel did not align the mapping: it cannot use 2 MiB entries
    regions = size // HUGE_PAGE_BYTES  # whole 2 MiB regions of the file
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        cached = [
            int(region) * HUGE_PAGE_BYTES
            for region in np.flatnonzero(_cached_regions(address, regions * HUGE_PAGE_BYTES))
        ]
        # Fast path, the usual case: every cached region touched once through this mapping (mapped now
        # rather than at first use) comes with a 2 MiB entry.
        int(np.frombuffer(mapping, np.uint8)[cached].sum())
        by_address = _mapped_huge_bytes_by_address(path)
        if by_address is not None and by_address.get(address, 0) >= len(cached) * HUGE_PAGE_BYTES:
            return False
        # Unmapped here again before the regions are mapped one by one: a page mapped twice counts twice in
        # the process's resident size, which would otherwise peak near twice the file.
        mapping.madvise(mmap.MADV_DONTNEED)
        huge = _huge_mapped(fd, path, cached)
        if huge is None:
            return False
        small = [offset for offset, is_huge in zip(cached, huge, strict=True) if not is_huge]
        if not small:
            return False
        # One region first: drop it, read it back. Only if that gives a 2 MiB page is it worth re-reading the
        # others (kernels or filesystems without large folios never give one).
        probe = small[len(small) // 2]
        os.fsync(fd)  # a file still being written back has dirty pages, which cannot be dropped
        _drop_cached(mapping, fd, probe, HUGE_PAGE_BYTES)
        if _huge_mapped(fd, path, [probe]) != [True]:
            return False
        if 2 * len(small) > regions:
            _drop_cached(mapping, fd, 0, size)
        else:
            for offset in small:
                if offset != probe:
                    _drop_cached(mapping, fd, offset, HUGE_PAGE_BYTES)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _huge_mapped(fd: int, path: str | os.PathLike[str], offsets: list[int]) -> list[bool] | None:
    """Whether each 2 MiB region at the file offsets ``offsets`` is served with a 2 MiB entry when touched
    (reading it if it is not cached) through a fresh mapping of its own; ``None`` when that cannot be told
    (an unaligned mapping, no smaps)."""
    result: list[bool] = []
    for first in range(0, len(offsets), CHECK_BATCH):
        regions: list[mmap.mmap] = []  # one fresh mapping per region of the batch, closed below
        addresses: list[int] = []
        try:
            for offset in offsets[first : first + CHECK_BATCH]:
                region = mmap.mmap(fd, HUGE_PAGE_BYTES, prot=mmap.PROT_READ, offset=offset)
                regions.append(region)
                region.madvise(mmap.MADV_HUGEPAGE)
                addresses.append(_address(region))
                if addresses[-1] % HUGE_PAGE_BYTES:
                    return None
                region[0]  # one fault maps the whole folio if it is a huge one
            by_address = _mapped_huge_bytes_by_address(path)
            if by_address is None:
                return None
            result += [by_address.get(address, 0) >= HUGE_PAGE_BYTES for address in addresses]
        finally:
            for region in regions:
                region.close()
    return result


def _address(mapping: mmap.mmap) -> int:
    """Where ``mapping`` starts in memory (through a view released at once, so the mapping can be closed)."""
    view = np.frombuffer(mapping, np.uint8)
    address = view.ctypes.data
    del view
    return address


def _cached_regions(address: int, length: int) -> np.ndarray:
    """bool [length / 2 MiB]: whether the page cache holds the first 4 KiB page of each 2 MiB region of the
    mapping at ``address`` (``mincore``); all True where that call is unavailable."""
    regions = length // HUGE_PAGE_BYTES
    pages = length // mmap.PAGESIZE
    residency = (ctypes.c_ubyte * pages)()  # [pages] bit 0: resident
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        if libc.mincore(address, length, residency) != 0:
            return np.ones(regions, bool)
    except (OSError, AttributeError):
        return np.ones(regions, bool)
    first_pages = np.frombuffer(residency, np.uint8)[:: HUGE_PAGE_BYTES // mmap.PAGESIZE][:regions]
    return (first_pages & 1).astype(bool)


def _mapped_huge_bytes_by_address(path: str | os.PathLike[str]) -> dict[int, int] | None:
    """This process's mappings of the file ``path``, start address → bytes mapped with 2 MiB entries, from
    ``/proc/self/smaps``; ``None`` where that file does not exist."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
            result: dict[int, int] = {}
            start = None
            for line in smaps:
                fields = line.split(maxsplit=5)
                if fields and "-" in fields[0] and not fields[0].endswith(":"):  # start-end perms ... path
                    named = len(fields) == 6 and fields[5].rstrip("\n") == target
                    start = int(fields[0].split("-")[0], 16) if named else None
                elif start is not None and fields and fields[0] == "FilePmdMapped:":
                    result[start] = result.get(start, 0) + int(fields[1]) * 1024
            return result
    except OSError:
        return None


def _drop_cached(mapping: mmap.mmap, fd: int, offset: int, length: int) -> None:
    """Unmap bytes [offset, offset + length) of the file from ``mapping``; drop them from the page cache."""
    mapping.madvise(mmap.MADV_DONTNEED, offset, length)
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
