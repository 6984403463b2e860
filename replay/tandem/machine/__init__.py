"""The typed machine description: what tandem runs (Guest: board, boot, devices, OS), how
(Run: the mode and its parts), and the QEMU option builders every value goes through
(options.py). Pure: nothing here starts a process; qemu/argv.py composes the command
line, libvirt/domain.py the domain, formats/bundle.py checks the manifest with it.
"""
from .devices import DISK_FORMATS, Disk, Forward, Nic
from .guest import (
                      ACCEL,
                      CPUS,
                      DEFAULT_CMDLINE,
                      ICOUNT_SHIFT,
                      MACHINE_TYPE,
                      VCPUS,
                      Guest,
                      analyses_given,
                      disk_input,
                      replay_args,
)
from .options import (
                      LOOKAHEAD_NS,
                      MAC,
                      NIC_DEVICES,
                      NIC_MODELS,
                      RTC_BASE,
                      VIRTIO_NET,
                      OptionError,
                      Value,
                      check_id,
                      check_mac,
                      escape,
                      json_option,
                      keyval_option,
)
from .run import RR, Feed, Gate, Host, Mode, RRMode, Run, UserNet, overlay_path
from .section import DiskEntry, LibvirtSection, MachineSection, NetSection, NicEntry, OwnLine, Recorded

__all__ = ["ACCEL", "CPUS", "DEFAULT_CMDLINE", "DISK_FORMATS", "Disk", "Feed", "Forward", "Gate", "Guest", "Host", "ICOUNT_SHIFT",
           "LOOKAHEAD_NS", "MAC", "MACHINE_TYPE", "Mode", "NIC_DEVICES", "NIC_MODELS", "Nic", "OptionError", "RR", "RRMode",
           "RTC_BASE", "Run", "UserNet", "VCPUS", "VIRTIO_NET", "Value", "analyses_given", "check_id", "disk_input", "check_mac",
           "escape", "json_option", "keyval_option", "overlay_path", "replay_args",
           "DiskEntry", "LibvirtSection", "MachineSection", "NetSection", "NicEntry", "OwnLine", "Recorded"]
