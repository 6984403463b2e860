"""bench/cpu_profile.py: the share of a profile's samples in the device log's code, read
from `perf script -F comm,pid,tid,ip,sym,dso` text in the layout perf 6.1 prints (a
header line, the stack leaf first, a blank line; a thread name may hold spaces)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import cpu_profile  # noqa: E402


def sample(comm: str, *frames: str) -> str:
    return "\n".join([f"{comm}  4242/4243  ", *(f"\t    {0x5000 + 16 * i:x} {f}" for i, f in enumerate(frames)), ""])


QEMU = "(/root/.cache/tandem/qemu-x/install/bin/qemu-system-x86_64)"
TEXT = "\n".join([
    sample("CPU 0/TCG", f"devlog_record_iov {QEMU}", f"filter_devlog_receive_iov {QEMU}",
           f"qemu_netfilter_receive {QEMU}", "[unknown] ([unknown])"),
    sample("qemu-system-x86", "copy_user_enhanced_fast_string ([kernel.kallsyms])",
           "vfs_write ([kernel.kallsyms])", "__libc_write (inlined)", f"devlog_flush_locked {QEMU}",
           f"devlog_flush_tick {QEMU}", f"main_loop_wait {QEMU}"),
    sample("CPU 1/TCG", "[unknown] ([unknown])"),                       # the guest's translated code
    sample("CPU 1/TCG", f"virtio_net_flush_tx {QEMU}", f"qemu_net_queue_send {QEMU}"),
    sample("qemu-system-x86", "__memmove_avx_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)",
           f"devlog_state_tick {QEMU}"),
])


def test_samples_with_a_device_log_frame_anywhere_in_the_stack_are_the_recordings():
    p = cpu_profile.read(TEXT)
    assert (p.samples, p.recording) == (5, 3) and p.share == 0.6
    assert p.by_thread == {"CPU 0/TCG": 1, "CPU 1/TCG": 2, "qemu-system-x86": 2}
    assert p.recording_by_thread == {"CPU 0/TCG": 1, "qemu-system-x86": 2}
    # the kernel's write is charged to the device log's flush, the frame nearest the leaf that matched
    assert p.recording_by_function == {"devlog_record_iov": 1, "devlog_flush_locked": 1, "devlog_state_tick": 1}


def test_threads_named_by_their_id_where_told():
    p = cpu_profile.read(TEXT, {4243: "vCPU 0"})
    assert p.by_thread == {"vCPU 0": 5} and p.recording_by_thread == {"vCPU 0": 3}


def test_a_profile_of_nothing_and_a_sample_without_a_trailing_blank_line():
    assert cpu_profile.read("").samples == 0 and cpu_profile.read("").share == 0.0
    p = cpu_profile.read(sample("qemu-system-x86", f"devlog_record {QEMU}").rstrip("\n"))
    assert (p.samples, p.recording) == (1, 1)
