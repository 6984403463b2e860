"""Live shadows of an ordinary guest: `tandem shadow` with the guest
options `tandem record` takes, the reference VM (Debian 12 from its own disk, GRUB,
systemd, nginx, redis) served live under Debian's clients while an analysis kernel boots
the same disk and trails it."""
from __future__ import annotations

import shutil

import pytest
from helpers import analyses, start_client, wait_until
from helpers.live import run_until_native_stops, summary_text
from helpers.refvm import dhcp_to_guest, offered_then_acked
from tandem import artifacts
from tandem.live.shadow import ShadowOptions, ShadowRun
from tandem.machine import Forward, Guest
from tandem.qemu.vm import free_port
from tandem.record import clients


@pytest.mark.timeout(2400)
def test_a_live_shadow_of_the_reference_vm_is_clean(built, tmp_path):
    """`tandem shadow --disk ... --forward ...`: the reference VM served live while a KASAN
    analysis boots its disk and trails it (its root device read from what the native's
    kernel printed at boot); powered off by its button, the analysis follows: nothing
    found, nothing different, its DHCP answered from the live recording."""
    ref = artifacts.refvm()
    base = tmp_path / "refvm.qcow2"
    shutil.copyfile(ref["disk"], base)
    http, redis = free_port(), free_port()
    # At normal priority: at idle priority (the default) an analysis gets only CPU time
    # nothing else wants, and the suite's other VMs want it all.
    sh = ShadowRun(tmp_path / "live.tdm", analyses("kasan"), ShadowOptions(record_analyses=False, idle_analyses=False),
                   workdir=tmp_path / "an",
                   guest=Guest.of_disks([(str(base), "qcow2")]),
                   forwards=(Forward("tcp", http, 80), Forward("tcp", redis, 6379)))
    sh.start()

    def serve():
        wait_until(lambda: clients.http_up(http), 600, "nginx on the reference VM", poll=1.0)
        wait_until(lambda: clients.redis_up(redis), 120, "redis on the reference VM", poll=1.0)
        clients.fetch_files(http, {f["path"]: f["sha256"] for f in ref["site"]})
        clients.ab(http, requests=50)
        clients.redis_benchmark(redis, requests=200)
    client = start_client(serve, "clients")
    pressed = []

    def power_button_once_served():     # from this thread: QMP is the sampling loop's
        if not client.is_alive() and client.error is None and not pressed:
            pressed.append(sh.native.powerdown())
    run_until_native_stops(sh, power_button_once_served, timeout=1200, client=client)
    client.join(0)
    s = sh.finish(timeout=1800)
    (r,) = s.results
    assert r.run.outcome in ("poweroff", "finished"), (r.run.outcome, r.run.detail, r.run.qemu_log[-2000:])
    assert r.complete and not r.findings and not r.divergences, summary_text(s)
    assert offered_then_acked(dhcp_to_guest(tmp_path / "an" / "kasan.pcapng")), s.limits
    # a DISCOVER the slower kernel sent again was answered again, not reported
    assert not [x for x in s.limits if "DHCP" in x], s.limits
    assert s.exit_status() == 0
