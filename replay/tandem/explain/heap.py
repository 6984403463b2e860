"""The native's kernel heap as its exact replay made it: every slab allocation (its
returned pointer and requested size) and every free, from the tandem-calls plugin's
call and return events, so an address the window touched can be named as KASAN names
it: which object, how far into it or past its end, live or freed, and by whom and when.

A KASAN kernel knows this from its shadow memory; the native has none, so tandem reads
it from the calls the native made."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..assertions.events import Event

# Linux 6.12's slab allocation entry points: name -> (argument holding the requested
# size, or None: the cache's own object size; argument holding the cache, or None).
ALLOCS = {
    "__kmalloc_noprof": (0, None), "__kmalloc_node_noprof": (0, None),
    "__kmalloc_node_track_caller_noprof": (0, None),
    "__kmalloc_cache_noprof": (2, 0), "__kmalloc_cache_node_noprof": (3, 0),
    "__kmalloc_large_noprof": (0, None), "__kmalloc_large_node_noprof": (0, None),
    "kmem_cache_alloc_noprof": (None, 0), "kmem_cache_alloc_lru_noprof": (None, 0),
    "kmem_cache_alloc_node_noprof": (None, 0), "krealloc_noprof": (1, None),
}
# name -> the argument holding the pointer freed
FREES = {"kfree": 0, "kmem_cache_free": 1}
# The kmalloc caches' object sizes (mm/slab_common.c's kmalloc_info, x86-64, 4 KiB pages)
KMALLOC_SIZES = (8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192)


def slot_size(size: int) -> int:
    """The kmalloc slot a request of `size` bytes lands in (a large one: whole pages)."""
    for s in KMALLOC_SIZES:
        if size <= s:
            return s
    return -(-size // 4096) * 4096


@dataclass(frozen=True)
class Alloc:
    ptr: int
    size: int | None         # requested (None: a cache's object, size not known)
    icount: int
    vm_ns: int
    by: str                  # the allocation's caller (symbol+offset)
    func: str                # the allocator called
    freed_icount: int | None = None
    freed_vm_ns: int | None = None
    freed_by: str = ""

    @property
    def slot(self) -> int:
        return slot_size(self.size or 8)

    @property
    def cache(self) -> str:
        """The kmalloc cache a kmalloc of this size takes its slot from (as KASAN names it), ""
        for a named cache's object or a page-sized allocation."""
        if self.func.startswith("kmem_cache") or "large" in self.func or self.slot > KMALLOC_SIZES[-1]:
            return ""
        s = self.slot
        return f"kmalloc-{s // 1024}k" if s >= 1024 else f"kmalloc-{s}"


@dataclass(frozen=True)
class Place:
    """Where an address lies relative to the heap object nearest below it."""
    obj: Alloc
    offset: int               # from the object's start
    state: str                # "allocated" or "freed", at the access

    def describe(self) -> str:
        o = self.obj
        size = f"{o.size}-byte" if o.size is not None else "cache"
        if o.size is not None and self.offset >= o.size:
            where = f"{self.offset - o.size} bytes to the right of {self.state} {size} region"
        else:
            where = f"{self.offset} bytes inside of {self.state} {size} region"
        cache = f" (cache {o.cache})" if o.cache else ""
        return f"{where} [{o.ptr:#x}, {o.ptr + (o.size or 0):#x}){cache}"


class Heap:
    """Allocations and frees in instruction-count order; what was at an address at a count."""

    def __init__(self, events: list[Event], caller=lambda e: ""):
        self.allocs: list[Alloc] = []
        self.frees: list[tuple[int, int, int, str]] = []    # (icount, ptr, vm_ns, by)
        for e in events:
            if e.kind == "return" and e.func in ALLOCS and e.ret:
                size_arg, _ = ALLOCS[e.func]
                size = e.args[size_arg] if size_arg is not None else None
                self.allocs.append(Alloc(e.ret, size, e.icount, e.vm_ns, caller(e), e.func))
            elif e.kind == "call" and e.func in FREES:
                ptr = e.args[FREES[e.func]]
                if ptr:
                    self.frees.append((e.icount, ptr, e.vm_ns, caller(e)))
        self.allocs.sort(key=lambda a: a.icount)
        self.frees.sort()
        self.by_page: dict[int, list[Alloc]] = {}      # page -> allocations whose slot touches it
        for a in self.allocs:
            for page in range(a.ptr >> 12, ((a.ptr + a.slot - 1) >> 12) + 1):
                self.by_page.setdefault(page, []).append(a)

    def at(self, addr: int, icount: int) -> Place | None:
        """The object whose slot holds addr at instruction count icount: the newest allocation
        at or below addr made before icount whose slot reaches it, live or freed since."""
        best: Alloc | None = None
        for a in self.by_page.get(addr >> 12, ()):
            if a.icount >= icount:
                break
            if a.ptr <= addr < a.ptr + a.slot and (best is None or a.icount > best.icount):
                best = a
        if best is None:
            return None
        free = next(((i, ns, by) for i, p, ns, by in self.frees[bisect.bisect_right(self.frees, (best.icount,)):]
                     if p == best.ptr and i < icount), None)
        if free is not None:
            best = Alloc(best.ptr, best.size, best.icount, best.vm_ns, best.by, best.func, *free)
        return Place(best, addr - best.ptr, "freed" if free else "allocated")
