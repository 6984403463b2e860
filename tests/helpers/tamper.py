"""A recording altered on purpose, as a recording that logged something else would be: one
byte of one input changed in its replay log, the segment's checks and the manifest's hash
of the log made to agree again (so the bundle passes every check, and only its replay can
tell)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from tandem.formats import bundle, pcapng, rrstream


def alter_frame(bundle_dir: Path, *, after_ns: int, min_len: int = 80) -> pcapng.Event:
    """Change the last byte of the first frame into the guest at or after VM time after_ns
    (at least min_len bytes, found exactly once in the replay log) in the bundle's replay
    log; returns that frame's device-log event (what the recording logged)."""
    d = Path(bundle_dir)
    log = pcapng.read_devlog(d / bundle.DEVLOG)
    info = rrstream.StreamInfo()
    raws = list(rrstream.iter_raw(d / bundle.STREAM, info))
    for ev in log.events:
        if ev.kind != "net" or ev.direction != "in" or ev.vm_ns < after_ns or len(ev.data) < min_len:
            continue
        hits = [(i, raw.find(ev.data)) for i, raw in enumerate(raws) if ev.data in raw]
        if len(hits) != 1 or raws[hits[0][0]].count(ev.data) != 1:
            continue
        i, at = hits[0]
        raw = bytearray(raws[i])
        raw[at + len(ev.data) - 1] ^= 0x20
        raws[i] = bytes(raw)
        _rewrite(d, info, raws)
        return ev
    raise AssertionError(f"{d}: no frame into the guest after {after_ns} ns found once in its replay log")


def _rewrite(d: Path, info: rrstream.StreamInfo, raws: list[bytes]) -> None:
    out = d / (bundle.STREAM + ".new")
    w = rrstream.StreamWriter(out, version=info.version or rrstream.DEFAULT_REPLAY_VERSION, compress=True)
    for seg, raw in zip(info.segments, raws):
        w.segment(raw, seg.icount, end=seg.end)
    w.close()
    out.replace(d / bundle.STREAM)
    m = bundle.load_manifest(d)
    files = dict(m.files)
    files[bundle.STREAM] = bundle.file_entry(d / bundle.STREAM)
    bundle.write_manifest(d, dataclasses.replace(m, files=files))
