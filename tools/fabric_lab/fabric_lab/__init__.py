"""The fabric lab: Debian's Linux NVMe-oF target (nvmet) booted in QEMU for fx100io's tests.

The package is split by job: lab_paths (where things live), host_tools (host packages),
debian_packages (fetching and unpacking .debs), initramfs (building the guest image),
lab_config (subsystems, namespaces, ports), networking (netns + tap), qemu_vm (launching
and stopping QEMU), lab_state (the running lab's state file), lab_control (start/stop/status,
used by both lab.py and the pytest fixture) and guest_console (running commands in the guest).
"""
