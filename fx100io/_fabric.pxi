# Binding of the NVMe-oF control path (csrc/fabric.c): discovery; included by _core.pyx.
