"""What tandem could not do is reported apart from findings, with its own exit status:
hung, lagging, detached, an error, a VM that never booted are failures of
the analysis, not findings about the guest; a crash after the first input is a finding."""
import pytest

from tandem import errors
from tandem.semantic import analyze, findings, inputs, model
from tandem.semantic.comparison import compare


def run(outcome: str, booted: bool = True, stopped_before: str = "") -> model.AnalysisRun:
    r = model.AnalysisRun("kasan", outcome=outcome, detail="why", stopped_before=stopped_before, end_ns=10)
    if booted:
        r.deliver(5, inputs.Input("tcp-open", 5, flow=0))
    return r


@pytest.mark.parametrize("outcome", ["hung", "lagging", "detached", "error"])
def test_tandems_own_ends_are_failures_not_findings(outcome):
    r = run(outcome, stopped_before="tcp-data at VM 1.0s")
    assert findings.outcome(r) == []
    f = findings.failure(r)
    assert f.startswith(outcome) and "why" in f and "stopped before tcp-data at VM 1.0s" in f


def test_a_crash_after_the_first_input_is_a_finding_about_the_guest():
    r = run("crashed")
    (f,) = findings.outcome(r)
    assert f.type == "VM-CRASH" and "tcp-open" in f.after_input
    assert findings.failure(r) is None


@pytest.mark.parametrize("said", ["panic: tb_session_close: session already closed\ncpuid = 0\n",
                                  "[   12.5] Kernel panic - not syncing: Fatal exception\n"])
def test_a_crash_its_kernel_said_is_its_panic_finding_alone(said):
    """A report that is the kernel's panic (FreeBSD's failed KASSERT, Linux's oops=panic) is
    that crash already: no VM-CRASH finding beside it. One that is not says nothing of it."""
    r = run("crashed")
    panic = findings.Finding("kasan", "KASSERT", "panic", 7, "x", None, None, None,
                             text="some lines\n" + said, frames=[], locations=[])
    assert findings.outcome(r, [panic]) == []
    lor = findings.Finding("kasan", "WITNESS_LOR", "lor", 7, "x", None, None, None,
                           text="lock order reversal:\n 1st 0x1 a (a) @ x.c:1\n", frames=[], locations=[])
    assert [f.type for f in findings.outcome(r, [lor])] == ["VM-CRASH"]


def test_a_crash_before_the_first_input_is_a_vm_that_did_not_boot():
    r = run("crashed", booted=False)
    r.deliver(0, inputs.Input("rng", 0, b"x"))      # entropy is no input the guest reached
    assert findings.outcome(r) == []
    assert findings.failure(r).startswith("did not boot")


@pytest.mark.parametrize("outcome", ["poweroff", "finished"])
def test_a_clean_end_is_neither(outcome):
    assert findings.outcome(run(outcome)) == [] and findings.failure(run(outcome)) is None


def result(**kw) -> analyze.AnalysisResult:
    return analyze.AnalysisResult("kasan", run("poweroff"), kw.get("findings", []), kw.get("divergences", []),
                                  0, [], kw.get("failure"), kw.get("not_analysed", []))


def test_exit_status_says_found_incomplete_or_clean():
    na = compare.NotAnalysed("serial", 1, 2, b"line")
    div = compare.Divergence("serial", "differ", [], [], None, None, "", "")
    assert analyze.Summary("b", [result()]).exit_status() == errors.EXIT_CLEAN == 0
    assert analyze.Summary("b", [result(not_analysed=[na])]).exit_status() == errors.EXIT_INCOMPLETE == 3
    assert analyze.Summary("b", [result(failure="hung")]).exit_status() == errors.EXIT_INCOMPLETE
    # a finding wins: what was analysed found something
    assert analyze.Summary("b", [result(failure="hung"), result(divergences=[div])]).exit_status() == \
        errors.EXIT_FOUND == 1


def finding(title: str) -> findings.Finding:
    return findings.Finding("kasan", "BUG", title, 3, "none (before the first input)", None, None, None,
                            text="", frames=[], locations=[])


def test_a_vm_that_panicked_before_its_first_input_and_ran_on_did_not_boot():
    """A kernel whose early panic faults again as it reboots, over and over (a FreeBSD kernel
    booted directly, before its TSC delays work): lagging or hung in the end, but the panic
    it printed first is why it did not boot, not a finding."""
    r = run("lagging", booted=False)
    panic = findings.Finding("kasan", "PANIC", "panic: page fault", 3, "none (before the first input)", None,
                             None, None, text="Fatal trap 12: page fault\npanic: page fault\n", frames=[],
                             locations=[])
    why, found = findings.did_not_boot(r, [panic])
    assert found == [] and why == ("did not boot (its kernel panicked before its first input, then lagging: "
                                   "timed out): why; its console: panic: page fault"), why
    # lagging before the first input without a panic: tandem's limit as it is
    lor = findings.Finding("kasan", "WITNESS_LOR", "lor", 3, "x", None, None, None, text="lock order reversal:\n",
                           frames=[], locations=[])
    assert findings.did_not_boot(r, [lor]) == (findings.failure(r), [lor])


def test_what_a_vm_that_did_not_boot_printed_is_its_failure_not_a_finding():
    """A kernel that cannot mount the guest's root panics before the first input: the panic
    says why the analysis did not boot; it is no bug of the guest's."""
    r = run("crashed", booted=False)
    why, found = findings.did_not_boot(r, [finding("kernel panic: VFS: Unable to mount root fs")] * 2)
    assert found == [] and why.startswith("did not boot") and why.endswith(
        "its console: kernel panic: VFS: Unable to mount root fs")
    # one that booted, or stopped for tandem's own reasons, keeps its findings
    booted = run("crashed")
    assert findings.did_not_boot(booted, [finding("x")]) == (None, [finding("x")])
    hung = run("hung", booted=False)
    why, found = findings.did_not_boot(hung, [finding("lockdep: possible deadlock")])
    assert why.startswith("hung") and [f.title for f in found] == ["lockdep: possible deadlock"]
