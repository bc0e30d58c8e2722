#!/bin/busybox sh
# /init of the fabric lab guest: PID 1 of a busybox initramfs running Debian's 6.1 kernel.
#
# It loads the NVMe-oF target modules, defines lab_* helpers, then sources /lab/setup.sh,
# which the host generated from the lab config (lab_config.guest_setup_script) and appended
# to the initramfs as a second cpio archive. So this file never changes with the config and
# the cached base image stays valid.
#
# The host watches the serial console for lines starting with "FX100IO-LAB:": READY means
# the target listens, FAILED means setup stopped (the reason follows). After READY a shell
# reads commands from the serial console (used by `lab.py guest -- CMD`).

/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
MARK="FX100IO-LAB:"
NVMET=/sys/kernel/config/nvmet

console_shell() {
    # PID 1 must never exit (the kernel would panic), so serve the console forever. The shell
    # reads a pipe, not the tty, so it is non-interactive: no prompt and no line-editing escape
    # codes mixed into the output that lab.py guest parses (the tty still echoes input).
    # The pipe is fed by `read`, line by line: busybox cat copies with sendfile, which holds
    # a line back until more input arrives.
    while true; do
        setsid sh -c 'while IFS= read -r line; do printf "%s\n" "$line"; done </dev/ttyS0 |
            sh >/dev/ttyS0 2>&1'
        sleep 1
    done
}

lab_fail() {
    echo "$MARK FAILED: $*"
    dmesg | tail -n 30
    console_shell
}

lab_step() {
    echo "$MARK step: $*"
}

load() {
    # Some of these are built in on other kernels; only a real module that fails matters.
    for module in "$@"; do
        modprobe "$module" || lab_fail "modprobe $module"
    done
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /tmp /run
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
echo "$MARK step: kernel $(uname -r) up after $(cut -d' ' -f1 /proc/uptime) s"

load configfs
mount -t configfs configfs /sys/kernel/config || lab_fail "mount configfs"
# nvmet computes CRC32C (digests) and T10-PI through the crypto API, which would try to
# request_module by alias; loading the providers first avoids depending on alias lookup.
load virtio_pci virtio_net crc32c_generic crc32c-intel crct10dif_generic crc64_rocksoft_generic
load nvme nvmet nvmet-tcp
# The kernel initiator, for `nvme connect` in the guest against targets on the host side:
# nvme-cli opens /dev/nvme-fabrics, which devtmpfs only shows once nvme-fabrics is loaded.
load nvme-fabrics nvme-tcp
# kTLS with AES-GCM (the tls ULP would ask for gcm(aes) by alias); the AES-NI and CLMUL
# providers only where the CPU model has those instructions
load tls gcm ghash-generic
modprobe aesni-intel 2>/dev/null; modprobe ghash-clmulni-intel 2>/dev/null
# nvme-cli's default host identity. Without these files it derives one from the DMI product
# UUID, which QEMU leaves all zeros, so every guest would present the same host NQN.
mkdir -p /etc/nvme
uuid=$(cat /proc/sys/kernel/random/uuid)
echo "nqn.2014-08.org.nvmexpress:uuid:$uuid" > /etc/nvme/hostnqn
echo "$uuid" > /etc/nvme/hostid

# ---- helpers called by /lab/setup.sh -------------------------------------------------------

wait_for() {
    # wait_for SECONDS TEST-ARGS...: poll until `test TEST-ARGS` holds.
    tries=$(($1 * 10))
    shift
    while ! test "$@"; do
        tries=$((tries - 1))
        [ "$tries" -gt 0 ] || return 1
        usleep 100000
    done
}

lab_network() {
    # lab_network IFACE ADDR/PREFIX GATEWAY
    wait_for 30 -e "/sys/class/net/$1" || lab_fail "no network interface $1"
    ip link set lo up
    ip link set "$1" up || lab_fail "ip link set $1 up"
    ip addr add "$2" dev "$1" || lab_fail "ip addr add $2 dev $1"
    ip route add default via "$3" || lab_fail "ip route add default via $3"
    lab_step "network $1 $2"
}

lab_brd_disks() {
    # lab_brd_disks COUNT SIZE_KIB: brd makes all its RAM disks at module load, equal size.
    load_args="rd_nr=$1 rd_size=$2"
    modprobe brd $load_args || lab_fail "modprobe brd $load_args"
    wait_for 10 -b "/dev/ram$(($1 - 1))" || lab_fail "brd made no /dev/ram$(($1 - 1))"
}

lab_null_blk_disk() {
    # lab_null_blk_disk NAME SIZE_MIB BLOCK_SIZE -> LAB_DEVICE: a RAM-backed disk made in
    # configfs, because null_blk's module parameters give every device the same block size.
    [ -d /sys/kernel/config/nullb ] || modprobe null_blk nr_devices=0 || lab_fail "modprobe null_blk"
    dir=/sys/kernel/config/nullb/$1
    mkdir "$dir" || lab_fail "mkdir $dir"
    echo "$2" > "$dir/size" && echo "$3" > "$dir/blocksize" &&
        echo 1 > "$dir/memory_backed" && echo 1 > "$dir/power" || lab_fail "configure null_blk $1"
    # 6.1 names configfs-made disks after their configfs directory; older kernels nullb<index>.
    for LAB_DEVICE in "/dev/$1" "/dev/nullb$(cat "$dir/index")" ""; do
        wait_for 5 -b "$LAB_DEVICE" && break
    done
    [ -n "$LAB_DEVICE" ] || lab_fail "null_blk $1 made neither /dev/$1 nor /dev/nullb<index>"
}

lab_nvme_disk() {
    # lab_nvme_disk SERIAL -> LAB_DEVICE: the QEMU NVMe drive with that serial. PCIe probing is
    # asynchronous and the controller number depends on probe order, so match by serial.
    tries=600
    while [ "$tries" -gt 0 ]; do
        for block in /sys/block/nvme*n*; do
            [ -e "$block/device/serial" ] || continue
            serial=$(cat "$block/device/serial")
            if [ "${serial%% *}" = "$1" ]; then
                LAB_DEVICE=/dev/${block##*/}
                wait_for 10 -b "$LAB_DEVICE" || lab_fail "no device node $LAB_DEVICE"
                return 0
            fi
        done
        tries=$((tries - 1))
        usleep 100000
    done
    lab_fail "no QEMU NVMe drive with serial $1 appeared"
}

lab_host() {
    mkdir -p "$NVMET/hosts/$1" || lab_fail "mkdir host $1"
}

lab_host_key() {
    # lab_host_key HOST_NQN HASH DHGROUP KEY [CTRL_KEY]: DH-HMAC-CHAP for that host (the
    # kernel needs CONFIG_NVME_TARGET_AUTH; without it these attributes do not exist).
    dir=$NVMET/hosts/$1
    [ -e "$dir/dhchap_key" ] || lab_fail "nvmet has no dhchap_key (kernel without NVMe auth)"
    echo -n "$2" > "$dir/dhchap_hash" || lab_fail "dhchap_hash $2 for $1"
    echo -n "$3" > "$dir/dhchap_dhgroup" || lab_fail "dhchap_dhgroup $3 for $1"
    echo -n "$4" > "$dir/dhchap_key" || lab_fail "dhchap_key for $1"
    if [ -n "$5" ]; then
        echo -n "$5" > "$dir/dhchap_ctrl_key" || lab_fail "dhchap_ctrl_key for $1"
    fi
    lab_step "host $1 authenticates (DH-HMAC-CHAP $2, $3${5:+, bidirectional})"
}

lab_subsystem() {
    # lab_subsystem NQN ALLOW_ANY_HOST(0|1)
    mkdir "$NVMET/subsystems/$1" || lab_fail "mkdir subsystem $1"
    echo "$2" > "$NVMET/subsystems/$1/attr_allow_any_host" || lab_fail "allow_any_host $1"
}

lab_allow_host() {
    # lab_allow_host SUBSYSTEM_NQN HOST_NQN: add HOST_NQN to the subsystem's allow-list.
    ln -s "$NVMET/hosts/$2" "$NVMET/subsystems/$1/allowed_hosts/$2" ||
        lab_fail "allow host $2 on $1"
}

lab_namespace() {
    # lab_namespace SUBSYSTEM_NQN NSID DEVICE
    dir=$NVMET/subsystems/$1/namespaces/$2
    mkdir "$dir" || lab_fail "mkdir namespace $2 of $1"
    echo -n "$3" > "$dir/device_path" || lab_fail "device_path $3"
    echo 1 > "$dir/enable" || lab_fail "enable namespace $2 of $1 ($3)"
    lab_step "namespace $1 nsid $2 on $3 ($(cat /sys/block/${3##*/}/queue/logical_block_size)-byte blocks)"
}

lab_rxe() {
    # lab_rxe NETDEV: soft-RoCE on the guest NIC, so nvmet-rdma has an RDMA device to bind to.
    # rxe computes its ICRC with the crypto API's "crc32", which it does not depend on.
    load crc32_generic crc32-pclmul ib_uverbs rdma_ucm rdma_rxe nvmet-rdma
    rdma link add rxe0 type rxe netdev "$1" || lab_fail "rdma link add rxe0 on $1"
    lab_step "rdma rxe0 on $1"
}

lab_port() {
    # lab_port ID TRTYPE(tcp|rdma) TRADDR TRSVCID
    dir=$NVMET/ports/$1
    mkdir "$dir" || lab_fail "mkdir port $1"
    echo "$2" > "$dir/addr_trtype" && echo ipv4 > "$dir/addr_adrfam" &&
        echo "$3" > "$dir/addr_traddr" && echo "$4" > "$dir/addr_trsvcid" ||
        lab_fail "configure port $1 ($2 $3:$4)"
}

lab_port_subsystem() {
    # lab_port_subsystem PORT_ID NQN: exporting the first subsystem on a port makes it listen.
    ln -s "$NVMET/subsystems/$2" "$NVMET/ports/$1/subsystems/$2" ||
        lab_fail "link $2 to port $1 (does the port's address bind?)"
}

lab_userland() {
    # lab_userland SHARE_DIR CHECKOUT: the host's root filesystem (9p tag fxhostroot,
    # read-only) at /host, made ready for `chroot /host`: the guest's own proc, sys, configfs
    # and dev (devtmpfs, so /dev/infiniband/uverbs0 and rdma_cm appear), fresh tmpfs at /tmp,
    # /run, /var/tmp and /dev/shm, the guest's /etc/nvme identity, CHECKOUT (9p tag
    # fxcheckout, read-only) and SHARE_DIR (9p tag fxguestout, writable) at their own absolute
    # paths. Not fatal: the target works without it, and guest runs report why.
    if ! lab_userland_mount "$@" >/run/userland-error 2>&1; then
        lab_step "guest userland unavailable: $(tail -n 1 /run/userland-error)"
        return 0
    fi
    rm -f /run/userland-error
    lab_step "guest userland: host root read-only at /host, $1 writable"
}

lab_userland_mount() {
    # Each step stops the setup on failure (set -e does not apply inside an `if` condition).
    modprobe 9pnet_virtio && modprobe 9p || return 1
    mkdir -p /host
    opts=trans=virtio,version=9p2000.L,msize=512000
    # The host's system files (interpreter, libraries, tools) are cached in the guest (loose:
    # never revalidated, so changes made on the host while the lab runs may go unseen); the
    # checkout and the share below are not cached, so a rebuild on the host shows at once.
    mount -t 9p -o "$opts,ro,cache=loose" fxhostroot /host || return 1
    mount -t proc proc /host/proc &&
        mount -t sysfs sysfs /host/sys &&
        mount -t configfs configfs /host/sys/kernel/config &&
        mount -t devtmpfs devtmpfs /host/dev &&
        mkdir -p /host/dev/pts /host/dev/shm &&
        mount -t devpts devpts /host/dev/pts || return 1
    for dir in /host/tmp /host/run /host/var/tmp /host/dev/shm; do
        [ -d "$dir" ] || continue
        mount -t tmpfs -o mode=1777 tmpfs "$dir" || return 1
    done
    if [ -d /host/etc/nvme ]; then
        mount -o bind /etc/nvme /host/etc/nvme || return 1
    fi
    # The checkout on its own too, so it is there even below /tmp; then the writable share.
    # mkdir only succeeds (and is only needed) below the guest's tmpfs mounts.
    mkdir -p "/host$2" "/host$1" 2>/dev/null
    mount -t 9p -o "$opts,ro" fxcheckout "/host$2" || { echo "cannot mount the checkout at $2"; return 1; }
    mount -t 9p -o "$opts" fxguestout "/host$1" || { echo "cannot mount the share at $1"; return 1; }
}

# ---- the configured target ----------------------------------------------------------------

[ -f /lab/setup.sh ] || lab_fail "no /lab/setup.sh in the initramfs (start the lab with lab.py)"
. /lab/setup.sh
echo "$MARK READY after $(cut -d' ' -f1 /proc/uptime) s"
# From here on the console carries command output; only errors from the kernel go there.
dmesg -n 4
console_shell
