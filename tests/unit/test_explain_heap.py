"""explain/heap.py: addresses placed in the native's slab objects as KASAN places them,
from allocation returns and frees in instruction-count order."""
from __future__ import annotations

from tandem.assertions.events import Event
from tandem.explain.heap import Heap, slot_size

P, Q = 0xFFFF888002215240, 0xFFFF888002215280      # two neighbouring kmalloc-64 slots


def ret(func, args, ptr, icount):
    return Event("return", func, args, ptr, 0, icount * 2, icount, 0, (0xFFFFFFFFA0000026,))


def call(func, args, icount):
    return Event("call", func, args, None, 0, icount * 2, icount, 0, (0xFFFFFFFFA0000050,))


def heap() -> Heap:
    return Heap([ret("__kmalloc_cache_noprof", (0, 0xCC0, 56), P, 100),      # 56 bytes in a 64-byte slot
                 ret("__kmalloc_noprof", (64, 0xCC0), Q, 110),
                 call("kfree", (P,), 200),
                 ret("__kmalloc_cache_noprof", (0, 0xCC0, 40), P, 300)],     # the slot reused
                caller=lambda e: f"caller@{e.icount}")


def test_slots():
    assert [slot_size(n) for n in (1, 8, 9, 56, 65, 96, 97, 1024, 8193)] == [8, 8, 16, 64, 96, 96, 128, 1024, 12288]


def test_inside_past_the_end_and_freed():
    h = heap()
    inside = h.at(P + 8, 150)
    assert (inside.offset, inside.state, inside.obj.size, inside.obj.by) == (8, "allocated", 56, "caller@100")
    past = h.at(P + 56, 150)                    # in the slot's slack: KASAN's "0 bytes to the right"
    assert (past.offset, past.state) == (56, "allocated")
    assert past.describe().startswith("0 bytes to the right of allocated 56-byte region")
    assert past.describe().endswith("(cache kmalloc-64)")
    freed = h.at(P + 8, 250)
    assert (freed.state, freed.obj.freed_icount, freed.obj.freed_by) == ("freed", 200, "caller@200")
    assert freed.describe().startswith("8 bytes inside of freed 56-byte region")
    reused = h.at(P + 8, 350)                   # the newest allocation of the slot wins
    assert (reused.state, reused.obj.size, reused.obj.icount) == ("allocated", 40, 300)


def test_not_in_any_object():
    h = heap()
    assert h.at(P + 8, 50) is None              # before its allocation
    assert h.at(0xFFFFFFFFA0002540, 500) is None    # module data
    assert h.at(Q + 8, 150).obj.ptr == Q
