"""A small bundle made by hand (a device log, a replay stream, a manifest), for the
readers' unit tests: no QEMU involved."""
from __future__ import annotations

from tandem.formats import bundle
from tandem.formats.pcapng import PcapngWriter
from tandem.formats.rrstream import StreamWriter


def make_bundle(tmp_path, *, finish=True, state="complete"):
    d = bundle.new_bundle(tmp_path / "run.tdm")
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"kernel" * 100)
    w = PcapngWriter(d / bundle.DEVLOG)
    s0, n0 = w.add_interface("serial0", "serial"), w.add_interface("net0", "net")
    w.event(s0, "out", 1_000, b"boot\n", 5, vcpu=0)
    w.event(n0, "in", 2_000, b"\x00" * 60, 7)
    w.event(n0, "out", 5_000, b"\x01" * 42, 9)
    w.close(end_vm_ns=6_000 if finish else None, icount=10)
    sw = StreamWriter(d / bundle.STREAM, compress=True)
    sw.segment(b"\x00" * 4000, 5)
    sw.close(icount=10 if finish else None, raw=b"\x01" * 100)
    m = bundle.Manifest.new().to_json()
    m.update(state=state, qemu={"binary": "/q", "build_id": "a" * 64, "patch_series": "b" * 64,
                                "version": "9.2.0"},
             inputs={"kernel": bundle.input_entry(kernel).to_json(), "initrd": None},
             machine={"accel": "tcg", "icount_shift": 0, "memory_mb": 256},
             stop={"reason": "shutdown", "vm_ns": 6_000, "icount": 10}, wall_time_s=1.5)
    m["files"] = {n: bundle.file_entry(d / n).to_json() for n in (bundle.DEVLOG, bundle.STREAM)}
    bundle.write_manifest(d, m)
    return d, m
