#!/usr/bin/env python3
"""Benchmark: semantic replay into analysis VMs (issue: semantic replay).

1. replay: analysis replay wall time vs the same analysis kernel serving the same
   client workload live (no recording), side by side, medians over --runs rounds.
2. comparator: CPU time on one core of loading a recording's inputs and outputs and
   of comparing them with an analysis run's, on two multi-flow workloads (small
   200-byte values, and bulk 4000-byte values with pipelined GETs): payload MB/s and
   device events/s.
3. protocols: the comparator on the reference VM's HTTP (wrk) and RESP (redis-benchmark)
   flows under the built-in protocol rules: payload MB/s on one core.
4. parallel: three analyses (kasan, ubsan, lockdep) with --jobs 2 vs one after the other.

Each part has its own block in docs/benchmarks.md (inside the `semantic` section), so
one part can be rerun alone:

Usage: ./tandem bench                                   (all parts, all benchmarks)
       ./tandem bench semantic --only comparator        (this file, one part)
       (= python bench/semantic.py --only comparator --out docs/benchmarks.md)
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import replace_section  # noqa: E402
from tandem.semantic.comparison import compare, equivalence
from tandem.semantic import inputs, model
from tandem import catalog  # noqa: E402
from tandem.semantic.driving import replay  # noqa: E402
from tandem.semantic.driving.replay import RunOptions  # noqa: E402
from tandem.formats import bundle, netpkt, pcapng  # noqa: E402
from tandem.record.recording import Recording  # noqa: E402
from tandem.semantic.analyze import analyze  # noqa: E402
from tandem.qemu.vm import VM, free_port
from tandem.qemu.image import make_overlay
from tandem.machine import Guest, Run, UserNet  # noqa: E402
from tandem.record.workload import KV, demo_traffic  # noqa: E402

SECTION = "semantic"
PARTS = ("replay", "comparator", "protocols", "parallel", "freebsd")
DEFAULT_PARTS = PARTS[:-1]      # freebsd: with a FreeBSD tree (TANDEM_FREEBSD_SRC) and its builds
TITLE = "## Semantic replay"

# Comparator workloads: CLIENTS concurrent connections each.
CLIENTS = 8
SMALL_REQUESTS, SMALL_VALUE = 150, 200              # SET/GET pairs per client, value bytes
BULK_KEYS, BULK_GETS, BULK_VALUE = 8, 8, 4000       # kvd takes request lines up to 4095 bytes
CMP_TARGET_MBS, CMP_TARGET_EVS, LOAD_TARGET_EVS = 500, 200_000, 200_000


def workload(port: int, serial) -> None:
    serial.wait_for(b"TANDEM-READY", 300)
    demo_traffic(port, rounds=20)
    serial.type("poweroff")


def concurrent(port: int, client) -> None:
    """client(kv, c) on CLIENTS connections at once; an error in one is raised here."""
    def run(c: int) -> None:
        with KV(port) as kv:
            client(kv, c)
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        list(pool.map(run, range(CLIENTS)))


def small_flows(port: int) -> None:
    """CLIENTS concurrent connections, SMALL_REQUESTS SET/GET pairs each, 200-byte values."""
    def client(kv: KV, c: int) -> None:
        for i in range(SMALL_REQUESTS):
            kv.request(f"SET c{c}k{i} {'v' * SMALL_VALUE}")
            kv.request(f"GET c{c}k{i}")
    concurrent(port, client)


def bulk_value(c: int, i: int) -> str:
    return (f"c{c}k{i}-" + "abcdefghijklmnopqrstuvwxyz0123456789" * 120)[:BULK_VALUE]


def bulk_flows(port: int) -> None:
    """CLIENTS concurrent connections; each SETs BULK_KEYS 4000-byte values and reads each
    back BULK_GETS times with pipelined GETs (one write, then the replies)."""
    def client(kv: KV, c: int) -> None:
        for i in range(BULK_KEYS):
            v = bulk_value(c, i)
            if kv.request(f"SET c{c}b{i} {v}") != "OK":
                raise RuntimeError("guest service: SET of a bulk value failed")
            if kv.requests([f"GET c{c}b{i}"] * BULK_GETS) != [f"VALUE {v}"] * BULK_GETS:
                raise RuntimeError("guest service: a bulk GET returned something else")
    concurrent(port, client)


def live(tmp: Path, flavor: str) -> float:
    """The analysis kernel serving the workload live: QEMU start to exit, no recording."""
    g = Guest.default(flavor)
    d = Path(tempfile.mkdtemp(dir=tmp))
    make_overlay(g.disk.base, d / "o.qcow2")
    port = free_port()
    t0 = time.monotonic()
    with VM(g, Run(d, net=UserNet(port), overlay=d / "o.qcow2")) as vm:
        workload(port, vm.serial)
        vm.wait(300)
    return time.monotonic() - t0


def record(tmp: Path, traffic=None, guest: Guest | None = None) -> Path:
    """Record the demo guest (or `guest`): the demo workload, or `traffic(port)` then poweroff."""
    path = Path(tempfile.mkdtemp(dir=tmp)) / "b.tdm"
    with Recording(path, guest=guest) as rec:
        if traffic:
            rec.wait_ready(300)
            traffic(rec.port)
            rec.serial.type("poweroff")
        else:
            workload(rec.port, rec.serial)
        rec.wait(timeout=300)
    return path


def part_replay(tmp: Path, runs: int, flavors=("kasan", "lockdep"), native: str | None = None) -> list[str]:
    """Each analysis kernel serving the workload live against the semantic replay into it
    of the native's recording (`native`: the kernel flavor recorded, default the demo's)."""
    res: dict[str, dict[str, list[float]]] = {f: {"live": [], "replay": [], "norec": []} for f in flavors}
    for i in range(runs):
        b = record(tmp, guest=Guest.default(native) if native else None)
        rec = inputs.load(b)
        for f in flavors:
            res[f]["live"].append(live(tmp, f))
            for key, record_run in (("replay", True), ("norec", False)):
                r = replay.run(rec, RunOptions(catalog.get(f), None, tmp / f"an{i}{f}{key}",
                                                        record=record_run))
                assert r.outcome == "poweroff", (f, r.outcome, r.detail)
                res[f][key].append(r.wall_s)
        print(f"round {i + 1}: " + ", ".join(f"{f} live {res[f]['live'][-1]:.2f}s replay "
                                              f"{res[f]['replay'][-1]:.2f}s (not recorded "
                                              f"{res[f]['norec'][-1]:.2f}s)" for f in flavors),
              file=sys.stderr)
    command = (f"`python bench/semantic.py --only freebsd --runs {runs} --out docs/benchmarks.md` (the FreeBSD "
               f"demo guest, recorded on {native}: a FreeBSD tree set)" if native else
               f"`./tandem bench` (runs `bench/semantic.py --runs {runs}`)")
    lines = [(f"Command: {command}. TCG on this 2-core machine; medians of interleaved rounds."), "",
             ("Analysis replay vs the same kernel serving the same workload live (boot to "
              "TANDEM-READY, 20 rounds of SET/GET from two clients, a SYNC, an `nc` session, "
              "poweroff). Target: replay at most 1.1x live. The replay records itself (the default; "
              "its bundle replays exactly); the last column is the same replay with `--no-record`."), "",
             "| analysis kernel | live (s) | semantic replay, recorded (s) | ratio | met | not recorded (s) |",
             "|---|---|---|---|---|---|"]
    for f in flavors:
        lv, rp = statistics.median(res[f]["live"]), statistics.median(res[f]["replay"])
        nr = statistics.median(res[f]["norec"])
        lines.append(f"| {f} | {lv:.2f} | {rp:.2f} | {rp / lv:.2f}x | {'yes' if rp / lv <= 1.1 else 'no'} "
                     f"| {nr:.2f} ({nr / lv:.2f}x) |")
    return lines


# --- comparator ---

def cpu_median(fn, reps: int):
    """Median CPU time (user + system of this process) of fn() over reps calls, and its result."""
    times, out = [], None
    for _ in range(reps):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def log_payload(devlog: Path) -> tuple[int, int, dict[str, list[int]]]:
    """(events, payload bytes, TCP segment payload sizes per direction) of a device log.
    Payload: TCP/UDP/ICMP payload of the frames (no headers) plus serial and entropy
    bytes, both directions; block-device events are counted as events, not payload."""
    n, payload, sizes = 0, 0, {"in": [], "out": []}
    for e in pcapng.iter_events(devlog):
        n += 1
        if e.kind in ("serial", "rng"):
            payload += len(e.data)
        elif e.kind == "net":
            f = netpkt.parse(e.data)
            if f and f.eth_type == netpkt.ETH_IP and f.proto in (netpkt.PROTO_TCP, netpkt.PROTO_UDP,
                                                                 netpkt.PROTO_ICMP):
                payload += len(f.payload)
                if f.proto == netpkt.PROTO_TCP and f.payload and e.direction in sizes:
                    sizes[e.direction].append(len(f.payload))
    return n, payload, sizes


def compared_bytes(rec: inputs.RecordedInputs, run: model.AnalysisRun) -> tuple[int, int]:
    """Guest output the comparator compares, (native, analysis): console bytes, TCP payload
    of every flow, UDP payload."""
    native = (sum(len(d) for _, d in rec.serial_out) + sum(fl.guest_bytes for fl in rec.flows)
              + sum(len(p) for _, _, p in rec.udp_out))
    analysis = len(run.console) + sum(out.data.end for out in (run.net.flows.values() if run.net else ()))
    for _, frame in run.net_out:
        f = netpkt.parse(frame)
        if f and f.eth_type == netpkt.ETH_IP and f.proto == netpkt.PROTO_UDP and not f.fragment:
            analysis += len(f.payload)
    return native, analysis


def sizes_text(xs: list[int]) -> str:
    if not xs:
        return "none"
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
    return f"{len(xs)} segments, median {statistics.median(xs):.0f} B, 90th percentile {q[8]:.0f} B, max {max(xs)} B"


def measure_comparator(tmp: Path, name: str, traffic, reps: int) -> dict:
    b = record(tmp, traffic)
    run = replay.run(inputs.load(b), RunOptions(catalog.NATIVE, None, tmp / f"cmp-{name}"))
    assert run.outcome == "poweroff", (name, run.outcome, run.detail)
    n_events, log_bytes, seg_sizes = log_payload(b / "devices.pcapng")
    t_load, rec = cpu_median(lambda: inputs.load(b), max(3, reps // 4))
    spec = equivalence.load(catalog.NATIVE)
    t_cmp, divs = cpu_median(lambda: compare.compare(rec, run, spec), reps)
    native, analysis = compared_bytes(rec, run)
    print(f"{name}: load {t_load * 1e3:.2f} ms, compare {t_cmp * 1e3:.3f} ms, {len(divs)} divergences",
          file=sys.stderr)
    return {"name": name, "events": n_events, "log_bytes": log_bytes, "file": (b / "devices.pcapng").stat().st_size,
            "flows": len(rec.flows), "sizes": seg_sizes, "t_load": t_load, "t_cmp": t_cmp, "divs": len(divs),
            "native": native, "analysis": analysis}


def part_comparator(tmp: Path, reps: int) -> list[str]:
    small = measure_comparator(tmp, "small", small_flows, reps)
    bulk = measure_comparator(tmp, "bulk", bulk_flows, reps)
    command = (f"Command: `./tandem bench semantic --only comparator` (runs `bench/semantic.py --only "
               f"comparator --reps {reps}`). CPU time of the benchmark process (`time.process_time`: user + "
               f"system) on one core, median of {reps} repetitions for comparing and {max(3, reps // 4)} "
               "for loading; the machine is shared and noisy.")
    workloads = (f"Two recordings of the demo guest, each with {CLIENTS} concurrent TCP clients, each "
                 "replayed into the native kernel through the semantic path to give the analysis side:")
    small_text = (f"- **small**: each client {SMALL_REQUESTS} SET/GET pairs of {SMALL_VALUE}-byte values, one "
                  f"request in flight. Requests are SET lines of ~{SMALL_VALUE + 13} B and GET lines of ~10 B; "
                  f"replies `OK` (3 B) and VALUE lines ({SMALL_VALUE + 7} B). TCP segment payloads: client to "
                  f"guest {sizes_text(small['sizes']['in'])}; guest to client {sizes_text(small['sizes']['out'])}.")
    bulk_text = (f"- **bulk**: each client SETs {BULK_KEYS} values of {BULK_VALUE} B, reading each back with "
                 f"{BULK_GETS} pipelined GETs (one write); replies are VALUE lines of {BULK_VALUE + 7} B. TCP "
                 f"segment payloads: client to guest {sizes_text(bulk['sizes']['in'])}; guest to client "
                 f"{sizes_text(bulk['sizes']['out'])}.")
    counted = ("What is counted. *events*: the blocks of the native's device log (`devices.pcapng` EPBs: "
               "frames in both directions, serial and entropy chunks, block writes), the same number for both "
               "steps. *Load payload*: the TCP/UDP/ICMP payload of those frames (headers not counted) plus "
               "serial and entropy bytes, both directions (block writes are read but not counted). "
               "*Compare payload*: the guest output compared, on both sides (native + analysis): console "
               "bytes, every flow's TCP payload, UDP payload. Loading (`inputs.load`: read the log, "
               "reassemble every flow, build the inputs and their dependencies) is timed from the file; "
               "comparing (`compare.compare` with the native spec) from the loaded recording and the "
               "analysis run in memory, whose streams (console writes, each flow's in-order TCP payload, "
               "UDP datagrams) the replayer collected while the analysis VM ran, as it parses every guest "
               "frame anyway; the comparator joins, splits, masks and diffs them.")
    targets = (f"Targets: compare >= {CMP_TARGET_MBS} MB/s and >= {CMP_TARGET_EVS // 1000}k events/s; load "
               f">= {LOAD_TARGET_EVS // 1000}k events/s (its MB/s is shown, not a target).")
    lines = ["### Comparator throughput", "", command, "", workloads, "", small_text, bulk_text, "",
             counted, "", targets, "",
             "| workload | step | events | payload (MB) | CPU ms | MB/s | events/s | met |",
             "|---|---|---|---|---|---|---|---|"]
    for w in (small, bulk):
        mb_load = w["log_bytes"] / 1e6
        mb_cmp = (w["native"] + w["analysis"]) / 1e6
        ev_load, ev_cmp = w["events"] / w["t_load"], w["events"] / w["t_cmp"]
        ok_load = ev_load >= LOAD_TARGET_EVS
        ok_cmp = mb_cmp / w["t_cmp"] >= CMP_TARGET_MBS and ev_cmp >= CMP_TARGET_EVS
        load_row = (f"| {w['name']} ({w['flows']} flows, log {w['file'] / 1e6:.2f} MB) | load inputs and "
                    f"outputs | {w['events']:,} | {mb_load:.2f} | {w['t_load'] * 1e3:.2f} "
                    f"| {mb_load / w['t_load']:,.0f} | {ev_load:,.0f} | {'yes' if ok_load else 'no'} |")
        cmp_row = (f"| {w['name']} | compare native vs analysis ({w['divs']} divergences) | {w['events']:,} "
                   f"| {mb_cmp:.2f} ({w['native'] / 1e6:.2f} + {w['analysis'] / 1e6:.2f}) "
                   f"| {w['t_cmp'] * 1e3:.3f} | {mb_cmp / w['t_cmp']:,.0f} | {ev_cmp:,.0f} "
                   f"| {'yes' if ok_cmp else 'no'} |")
        lines += [load_row, cmp_row]
    return lines


# --- comparator, on the reference VM's HTTP and RESP flows ---

WRK_SECONDS, WRK_PATH = 10, "/64k.bin"          # kept-alive HTTP/1.1: Date on every reply
RESP_REQUESTS = 20_000                          # redis-benchmark SET/GET, 4 clients


def record_refvm(tmp: Path, name: str, load) -> Path:
    """The reference VM from power-on under `load(http_port, redis_port)`, powered off by its button."""
    from tandem import artifacts
    from tandem.machine import Forward
    from tandem.record import clients
    ref = artifacts.refvm()
    d = Path(tempfile.mkdtemp(dir=tmp))
    base = d / "refvm.qcow2"
    shutil.copyfile(ref["disk"], base)
    http, redis = free_port(), free_port()
    path = d / f"{name}.tdm"
    with Recording(path, Guest.of_disks([(str(base), "qcow2")]),
                   forwards=(Forward("tcp", http, 80), Forward("tcp", redis, 6379))) as rec:
        deadline = time.monotonic() + 900
        while not (clients.http_up(http) and clients.redis_up(redis)):
            if time.monotonic() > deadline or not rec.running():
                raise RuntimeError("the reference VM's services did not come up")
            time.sleep(1)
        load(http, redis)
        rec.powerdown()
        rec.wait(timeout=600)
    return path


def measure_protocol(tmp: Path, name: str, load, reps: int) -> dict:
    """Compare CPU time of one reference-VM recording against its replay into the native
    kernel booting the same disk, under the built-in protocol rules (the spec a user's VM
    gets: HTTP's and RESP's rules chosen per connection)."""
    from tandem.semantic import guests
    b = record_refvm(tmp, name, load)
    rec = inputs.load(b)
    rec.power_button = True
    manifest = bundle.load_manifest(b)
    run = replay.run(rec, RunOptions(catalog.NATIVE, guests.analysis_guest(b, manifest, catalog.NATIVE),
                                              tmp / f"cmp-{name}", record=False, line_deps=False))
    assert run.outcome in ("poweroff", "finished"), (name, run.outcome, run.detail)
    spec = equivalence.load(catalog.NATIVE, None, users_guest=True)
    n_events, log_bytes, seg_sizes = log_payload(b / "devices.pcapng")
    t_cmp, divs = cpu_median(lambda: compare.compare(rec, run, spec), reps)
    native, analysis = compared_bytes(rec, run)
    protocols = sorted({fl.protocol or "other" for fl in rec.flows if fl is not None})
    print(f"{name}: compare {t_cmp * 1e3:.3f} ms, {len(divs)} divergences, protocols {protocols}", file=sys.stderr)
    return {"name": name, "events": n_events, "flows": len(rec.flows), "sizes": seg_sizes, "t_cmp": t_cmp,
            "divs": len(divs), "native": native, "analysis": analysis, "protocols": protocols,
            "file": (b / "devices.pcapng").stat().st_size}


def part_protocols(tmp: Path, reps: int) -> list[str]:
    from tandem.record import clients
    http = measure_protocol(tmp, "http", lambda h, r: clients.wrk(h, WRK_PATH, seconds=WRK_SECONDS), reps)
    resp = measure_protocol(tmp, "resp", lambda h, r: clients.redis_benchmark(r, requests=RESP_REQUESTS), reps)
    lines = ["### Comparator throughput on HTTP and RESP, protocol rules on", "",
             f"Command: `./tandem bench semantic --only protocols` (runs `bench/semantic.py --only protocols "
             f"--reps {reps}`). CPU time of the benchmark process on one core, median of {reps} repetitions, "
             "of `compare.compare` under the spec a user's VM gets (console not compared; each connection "
             "under its protocol's built-in rules, docs/equivalence.md: HTTP's Date, ETag, Last-Modified, "
             "...; RESP's INFO fields and bulk lengths), between a recording of the reference VM (its own "
             "disk, systemd, nginx, redis; from power-on to its power button) and its replay into tandem's "
             "native kernel booting that disk:", "",
             f"- **http**: wrk, 4 connections kept alive for {WRK_SECONDS} s, GET {WRK_PATH} (65,536-byte "
             "body, a Date header per reply): guest to client " + sizes_text(http["sizes"]["out"]) + ".",
             f"- **resp**: redis-benchmark -c 4 -n {RESP_REQUESTS} -t set,get: guest to client "
             + sizes_text(resp["sizes"]["out"]) + ".", "",
             f"Target: compare >= {CMP_TARGET_MBS} MB/s.", "",
             "| workload | flows (protocols) | events | payload compared (MB) | CPU ms | MB/s | divergences | met |",
             "|---|---|---|---|---|---|---|---|"]
    for w in (http, resp):
        mb = (w["native"] + w["analysis"]) / 1e6
        lines.append(f"| {w['name']} | {w['flows']} ({', '.join(w['protocols'])}) | {w['events']:,} "
                     f"| {mb:.2f} ({w['native'] / 1e6:.2f} + {w['analysis'] / 1e6:.2f}) | {w['t_cmp'] * 1e3:.2f} "
                     f"| {mb / w['t_cmp']:,.0f} | {w['divs']} | {'yes' if mb / w['t_cmp'] >= CMP_TARGET_MBS else 'no'} |")
    return lines


def part_parallel(tmp: Path) -> list[str]:
    b = record(tmp)
    trio = [catalog.get(a) for a in ("kasan", "ubsan", "lockdep")]
    t0 = time.monotonic()
    analyze(b, trio, noise=False, jobs=1, workdir=tmp / "seq")
    seq = time.monotonic() - t0
    t0 = time.monotonic()
    analyze(b, trio, noise=False, jobs=2, workdir=tmp / "par")
    par = time.monotonic() - t0
    return ["Three analyses (kasan, ubsan, lockdep) of one recording, wall time:", "",
            "| mode | wall (s) |", "|---|---|",
            f"| one after the other (`--jobs 1`) | {seq:.2f} |",
            f"| in parallel (`--jobs 2`, 2 cores) | {par:.2f} ({seq / par:.2f}x faster) |"]


def write(path: Path, parts: dict[str, list[str]]) -> None:
    """Replace each measured part's block; the other parts' blocks stay as they are."""
    text = path.read_text() if path.exists() else ""
    if all(p in parts for p in PARTS) or f"<!-- bench:{SECTION} -->" not in text:
        blocks = [TITLE, ""]
        for p in PARTS:
            body = parts.get(p, ["(not measured yet)"])
            blocks += [f"<!-- bench:{SECTION}-{p} -->", *body, f"<!-- /bench:{SECTION}-{p} -->", ""]
        replace_section(path, "\n".join(blocks), SECTION)
        return
    for p, body in parts.items():
        begin, end = f"<!-- bench:{SECTION}-{p} -->", f"<!-- /bench:{SECTION}-{p} -->"
        if begin not in text:       # a new part: at the end of the section
            close = f"<!-- /bench:{SECTION} -->"
            text = text.replace(close, f"{begin}\n{end}\n\n{close}")
            path.write_text(text)
        replace_section(path, "\n".join(body), f"{SECTION}-{p}")
        text = path.read_text()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="rounds of the replay-vs-live part")
    ap.add_argument("--reps", type=int, default=21, help="repetitions of each comparator measurement")
    ap.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable)")
    ap.add_argument("--out", type=Path, help="replace this benchmark's blocks in this markdown file")
    args = ap.parse_args()
    only = args.only or list(DEFAULT_PARTS)
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-sem-"))
    parts: dict[str, list[str]] = {}
    try:
        if "replay" in only:
            parts["replay"] = part_replay(tmp, args.runs)
        if "comparator" in only:
            parts["comparator"] = part_comparator(tmp, args.reps)
        if "protocols" in only:
            parts["protocols"] = part_protocols(tmp, args.reps)
        if "parallel" in only:
            parts["parallel"] = part_parallel(tmp)
        if "freebsd" in only:
            parts["freebsd"] = ["### The FreeBSD demo guest into its debug kernel", "",
                                *part_replay(tmp, args.runs, ("freebsd-debug",), native="freebsd-native")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n\n".join("\n".join(parts[p]) for p in PARTS if p in parts))
    if args.out:
        write(args.out, parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
