"""Live shadow runs as libvirt domains: `tandem shadow --libvirt` and `tandem attach`
(real private libvirtd, real QEMU, real kernels; virsh as a user runs it)."""
from __future__ import annotations


import pytest
from conftest import assert_one_line_error, run_cli
from test_live import drive, run_until_native_stops
from test_virt import names, native_xml, virsh
from tandem import bundle, replay_exact, virt
from tandem.live import Shadow
from tandem.workload import KV, demo_traffic


@pytest.fixture(scope="module")
def libvirtd(built, tmp_path_factory):
    d = virt.Libvirtd(tmp_path_factory.mktemp("virt-live") / "libvirt")
    d.start()
    yield d
    d.stop()


def test_shadow_runs_native_and_analysis_as_domains(libvirtd, tmp_path):
    """tandem shadow --libvirt: virsh shows the native and its shadow while they run; the
    analysis follows live; the native's recording replays exactly outside libvirt, and so
    does the analysis run's; nothing is left defined."""
    uri = libvirtd.uri
    path = tmp_path / "web.tdm"
    sh = Shadow(path, ["native"], workdir=tmp_path / "an",
                libvirt=virt.LiveDomains.for_bundle(uri, path, ["native"]))
    sh.start()
    seen = {}

    def work():
        seen["list"] = names(uri)
        seen["dominfo"] = virsh(uri, "dominfo", "web-tandem-native")
        demo_traffic(sh.port, rounds=3)
        with KV(sh.port) as kv:
            seen["get"] = kv.request("GET key1")
    t = drive(sh, work)
    run_until_native_stops(sh)
    t.join(10)
    s = sh.finish()
    assert seen["list"] == {"web", "web-tandem-native"}, seen
    assert "running" in seen["dominfo"]
    assert seen["get"].startswith("VALUE value-1")
    (r,) = s.results
    assert r.run.outcome == "poweroff", r.run.detail
    assert len(r.run.delivered) > 0 and not r.divergences, [d.diff for d in r.divergences]
    assert names(uri, "--all") == set() and libvirtd.others() == []
    m = bundle.load_manifest(path)
    assert m["machine"]["libvirt"]["domain"] == "web" and m["state"] == "complete"
    v = replay_exact.replay(path)
    assert v.ok, v.summary()
    v = replay_exact.replay(tmp_path / "an" / "native.tdm")
    assert v.ok, v.summary()


def test_shadow_libvirt_cli(libvirtd, tmp_path):
    """The CLI: `tandem shadow NAME.tdm --libvirt=URI`, ended by --duration; a domain name
    already defined is refused before anything starts."""
    uri = libvirtd.uri
    r = run_cli("shadow", str(tmp_path / "cli.tdm"), "--analysis", "native", f"--libvirt={uri}",
                "--duration", "3s", "--no-record")
    assert r.returncode == 0, r.stderr
    assert "libvirt domains cli, cli-tandem-native" in r.stderr
    assert names(uri, "--all") == set() and libvirtd.others() == []
    assert bundle.load_manifest(tmp_path / "cli.tdm")["machine"]["libvirt"]["domain"] == "cli"
    assert replay_exact.replay(tmp_path / "cli.tdm").ok
    (tmp_path / "web.xml").write_text(native_xml(tmp_path))
    virsh(uri, "define", str(tmp_path / "web.xml"))
    try:
        assert_one_line_error(run_cli("shadow", str(tmp_path / "web.tdm"), "--analysis", "native",
                                      f"--libvirt={uri}"), "domain web: already defined")
        assert not (tmp_path / "web.tdm").exists()
    finally:
        virsh(uri, "undefine", "web")
