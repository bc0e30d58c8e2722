"""fx100io: io_uring and NVMe-oF I/O engine and KV-cache chunk store."""
