nvme-subsys0
