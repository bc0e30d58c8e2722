nvme0
nvme1
nvme2
nvme3
