# Binding of our NVMe/TCP target (csrc/target/); included by _core.pyx.
