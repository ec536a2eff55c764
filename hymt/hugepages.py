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
only then, drops the cached pages of the parts of the file held in small folios, so that the first use reads
them back in huge folios (one read from disk, once). Which parts: the file is looked at in 128 MiB chunks
through fresh mappings; when most chunks hold small folios (a freshly written file) the whole file's cache
goes. A file that is cached mostly in huge folios keeps them: another reader faulting a few evicted pieces
back in small folios (a second engine on the same file) would otherwise cost an 18 GB model a full re-read.
Pages other processes map are never dropped. Everything here is best effort: elsewhere, or when the kernel
cannot, nothing changes but speed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np

HUGE_PAGE_BYTES = 2 * 1024 * 1024
MIN_FILE_BYTES = 32 * 1024 * 1024  # below this, TLB reach covers the file anyway
SAMPLE_REGIONS = 4
CHUNK_BYTES = 128 * 1024 * 1024  # the unit of a partial re-read (a multiple of HUGE_PAGE_BYTES)


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
        # page is it worth re-reading what sits in small folios (kernels or filesystems without large folios
        # never give one).
        probe = samples[len(samples) // 2]
        os.fsync(fd)  # a file still being written back has dirty pages, which cannot be dropped
        mapping.madvise(mmap.MADV_DONTNEED, probe, HUGE_PAGE_BYTES)
        os.posix_fadvise(fd, probe, HUGE_PAGE_BYTES, os.POSIX_FADV_DONTNEED)
        int(view[probe])
        after = mapped_huge_bytes(path)
        if after is None or after <= before:
            return False
        small = _chunks_in_small_folios(fd, path, regions * HUGE_PAGE_BYTES)
        if small is None or len(small) * CHUNK_BYTES > size // 2:
            _drop_cached(mapping, fd, 0, size)
        else:
            for offset in small:
                _drop_cached(mapping, fd, offset, min(CHUNK_BYTES, size - offset))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _chunks_in_small_folios(fd: int, path: str | os.PathLike[str], whole: int) -> list[int] | None:
    """File offsets of the CHUNK_BYTES chunks of the first ``whole`` bytes (whole 2 MiB regions) that hold a
    region in small folios, found by touching every cached region through one fresh mapping per chunk and
    reading each mapping's 2 MiB-mapped bytes; ``None`` when that cannot be told (an unaligned mapping, no
    smaps)."""
    chunks: list[mmap.mmap] = []  # one fresh mapping per chunk, closed below
    starts: list[tuple[int, int, int]] = []  # (address, file offset, bytes) of each
    try:
        for offset in range(0, whole, CHUNK_BYTES):
            chunk = mmap.mmap(fd, min(CHUNK_BYTES, whole - offset), prot=mmap.PROT_READ, offset=offset)
            chunks.append(chunk)
            chunk.madvise(mmap.MADV_HUGEPAGE)
            view = np.frombuffer(chunk, np.uint8)  # [chunk bytes], read-only; released before the close
            address = view.ctypes.data
            if address % HUGE_PAGE_BYTES:
                del view
                return None
            # Only regions the cache holds are touched: reading the rest from disk here would move the
            # first use's reads into the load, and they will come in huge folios through our mapping anyway.
            cached = _cached_regions(address, len(chunk))
            for region in np.flatnonzero(cached):
                int(view[region * HUGE_PAGE_BYTES])
            del view
            starts.append((address, offset, int(cached.sum()) * HUGE_PAGE_BYTES))
        by_address = _mapped_huge_bytes_by_address(path)
        if by_address is None:
            return None
        return [
            offset for address, offset, cached_bytes in starts if by_address.get(address, 0) < cached_bytes
        ]
    finally:
        for chunk in chunks:
            chunk.close()


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
