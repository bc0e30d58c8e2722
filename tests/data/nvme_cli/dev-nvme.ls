crw------- 1 root root  10, 124 Dec  1 22:03 /dev/nvme-fabrics
crw------- 1 root root 246,   0 Dec  1 22:03 /dev/nvme0
brw------- 1 root root 259,   0 Dec  1 22:03 /dev/nvme0n1
crw------- 1 root root 246,   1 Dec  1 22:03 /dev/nvme1
brw------- 1 root root 259,   2 Dec  1 22:03 /dev/nvme1n1
crw------- 1 root root 246,   2 Dec  1 22:03 /dev/nvme2
brw------- 1 root root 259,   4 Dec  1 22:03 /dev/nvme2n1
