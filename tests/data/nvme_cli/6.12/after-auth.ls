nvme0
