"""The events the TCG plugin emits and the automata consume.

This module is the contract between the event source (the plugin and its decoder)
and the checker: both sides only use Event.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Event:
    """One function call or return (or an assertion site reached) in the guest kernel.

    kind: "call" (at the function's first instruction; args hold the first six
    integer arguments per the x86-64 SysV convention: rdi, rsi, rdx, rcx, r8, r9),
    "return" (at the function's return instruction back to its caller; ret holds
    rax; args hold the arguments saved at the matching call), or "site" (an
    instruction at symbol+offset was executed; args hold the registers above).
    """
    kind: str            # "call" | "return" | "site"
    func: str            # symbol name ("tcp_sendmsg"); for a site, "symbol+0xoff"
    args: tuple[int, ...]
    ret: int | None      # return value for "return", else None
    task: int            # guest address of the current task_struct (thread identity)
    vm_ns: int           # QEMU_CLOCK_VIRTUAL time in ns
    icount: int          # guest instructions executed so far
    pc: int              # guest pc of the event
    stack: tuple[int, ...] = field(default=())  # return addresses, innermost first

    def arg(self, i: int) -> int:
        return self.args[i] if i < len(self.args) else 0
