"""tandem's errors and its exit statuses: both are defined here, and only here.

Every failure tandem reports is a TandemError: the CLI prints its message as one line,
`tandem: error: MESSAGE`, naming the culprit (a file and an offset, a flag, a VM), and
exits with its exit_code; never with a traceback. The class says whose failure it is,
with the split syzkaller's vm/vmimpl makes between BootError (the kernel under test did
not come up) and InfraError (the VMM's own failure), beside the user's input:

    TandemError               the user's input, when raised as itself: a flag, a file, a
                              disk, a domain, a request tandem refuses
      BundleError             a recording bundle missing, corrupt, truncated or of another build
        MissingMember         (formats/bundle.py) a bundle member that is not there
      OptionError             (machine/options.py) a value that cannot be part of a QEMU option
      AssertionLangError      (assertions/lang.py) a malformed assertion file: FILE:LINE:COL
      FarmSpecError           (farm/spec.py) a farm file or farm flag that cannot be used
      ExplainError            (explain/explain.py) a finding that cannot be explained on the native
      BootError               the guest's: its kernel did not boot, it never answered (a
                              console line, a service), it did not shut down, it answered wrong
      InfraError              tandem's own machinery: QEMU crashed, refused to start or stopped
                              answering; libvirt refused; the host lacks a tool; a build failed
        QMPUnavailable        (qemu/vm.py) QEMU's QMP did not answer, or QEMU went away meanwhile
        TraceError            (assertions/trace.py) the assertion plugin's events missing or damaged
        StoreError            (farm/store.py) the farm's database cannot be opened or used
        StopError             (explain/stop.py) the stopped replay did not answer as its plugin says

A class that lives in another module (the layers let this one import nothing of tandem)
subclasses one of these and is listed above. Which one to raise: would the same command
work on a well-kept host (InfraError), with a guest that boots and answers (BootError),
or only with other input (TandemError, or the input's own subclass)?

Exit statuses, of `tandem` and of every module's own main():

    EXIT_CLEAN        0   nothing found: the replay verified, the analyses found nothing
    EXIT_FOUND        1   something found: a finding, a divergence, a replay that did not
                          verify, a violated assertion, a bundle that is not intact, a
                          host check that fails (doctor), a demo whose replay did not
                          verify or whose analyses did not finish
    EXIT_ERROR        2   a TandemError, of every class above: the message says whose
    EXIT_INCOMPLETE   3   nothing found, but tandem could not analyse the whole recording
                          (its own limit, never a finding: replay --analysis, shadow, attach;
                          a farm night whose only news is the harness's errors)
    EXIT_INTERRUPTED  130 interrupted (Ctrl-C): 128 + SIGINT, as a shell reports it
"""

EXIT_CLEAN, EXIT_FOUND, EXIT_ERROR, EXIT_INCOMPLETE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130


class TandemError(Exception):
    """A failure the user reads: one line naming the culprit (file, offset, flag, VM).

    Raised as itself it is the user's input; its subclasses say otherwise (above).
    """

    exit_code = EXIT_ERROR


class BundleError(TandemError):
    """A recording bundle is missing, corrupt, truncated or does not match this build."""


class BootError(TandemError):
    """The guest did not come up or misbehaved: its kernel did not boot, it never printed
    what tandem waited for, a service in it never answered or answered wrong, it did not
    shut down when asked."""


class InfraError(TandemError):
    """tandem's own machinery failed: QEMU exited, refused to start or stopped answering
    (QMP, the feed), libvirt or a private libvirtd refused, the host lacks a tool tandem
    needs, a build or a replay of tandem's own did not work."""
