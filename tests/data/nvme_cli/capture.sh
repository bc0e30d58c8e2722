#!/bin/sh
# Captures nvme-cli 2.3's JSON/text output and sysfs in the fabric lab guest, for the unit
# tests of fx100io.kernel (tests/test_kernel_parse.py).  Run from the checkout root:
#   flock /tmp/fx100io-lab.lock python3 tools/fabric_lab/lab.py run --rdma -- \
#     sh -c 'python3 tools/fabric_lab/lab.py guest -- sh tests/data/nvme_cli/capture.sh "$FX100IO_LAB_OUT"'
# with FX100IO_LAB_OUT a directory in the guest share (.lab/run/guest/...).
out=$1
mkdir -p "$out"
A=10.88.0.2
RAM=nqn.2026-11.io.fx100:lab-ram
NV=nqn.2026-11.io.fx100:lab-nvme
H=nqn.2026-11.io.fx100:lab-host
HID=0b9e7d1c-3f2a-4e5d-8c6b-7a9f0e1d2c3b
BADHID=0b9e7d1c3f2a4e5d8c6b7a9f0e1d2c3b
run() { # name, command...
    name=$1; shift
    "$@" >"$out/$name.out" 2>"$out/$name.err"
    echo $? >"$out/$name.rc"
}
uname -r >"$out/uname-r.txt"
nvme version >"$out/nvme-version.txt" 2>&1
run list-empty nvme list -o json
run list-v-empty nvme list -v -o json
run list-subsys-empty nvme list-subsys -o json
run discover-tcp nvme discover -t tcp -a $A -s 4420 -q $H -o json
run discover-rdma nvme discover -t rdma -a $A -s 4421 -q $H -o json
run discover-refused nvme discover -t tcp -a $A -s 4999 -q $H -o json
run connect-tcp-ram nvme connect -t tcp -a $A -s 4420 -n $RAM -q $H -I $HID -o json
run connect-tcp-ram-again nvme connect -t tcp -a $A -s 4420 -n $RAM -q $H -I $HID -o json
run connect-rdma-nvme nvme connect -t rdma -a $A -s 4421 -n $NV -q $H -I $HID -o json -i 2 -k 7 -g
sleep 2
run list nvme list -o json
run list-v nvme list -v -o json
run list-subsys nvme list-subsys -o json
mkdir -p "$out/sys"
for c in /sys/class/nvme/nvme*; do
  n=${c##*/}
  mkdir -p "$out/sys/class/nvme/$n"
  for f in address cntlid state subsysnqn transport hostnqn hostid queue_count sqsize kato \
      numa_node model serial firmware_rev dctype cntrltype ctrl_loss_tmo reconnect_delay \
      fast_io_fail_tmo dhchap_secret dhchap_ctrl_secret; do
    [ -e $c/$f ] && cat $c/$f >"$out/sys/class/nvme/$n/$f" 2>/dev/null
  done
  ls $c >"$out/sys/class/nvme/$n.ls"
done
for s in /sys/class/nvme-subsystem/nvme-subsys*; do
  n=${s##*/}
  mkdir -p "$out/sys/class/nvme-subsystem/$n"
  for f in subsysnqn subsystype model serial iopolicy; do
    [ -e $s/$f ] && cat $s/$f >"$out/sys/class/nvme-subsystem/$n/$f"
  done
  ls $s/ >"$out/sys/class/nvme-subsystem/$n.ls"
done
ls -l /sys/block/ >"$out/sys-block.ls-l"
for b in /sys/block/nvme*; do
  n=${b##*/}
  mkdir -p "$out/sys/block/$n"
  for f in size nsid queue/logical_block_size; do
    [ -e $b/$f ] && cat $b/$f >"$out/sys/block/$n/${f##*/}"
  done
done
for c in /sys/class/nvme/nvme*; do
  n=${c##*/}
  run list-ns-$n nvme list-ns /dev/$n -o json
done
ls -l /dev/nvme* >"$out/dev-nvme.ls"
dmesg -c >/dev/null 2>&1
run connect-hostid-not-uuid nvme connect -t tcp -a $A -s 4420 -n $RAM -q nqn.2026-11.io.fx100:other-host -I $BADHID -o json -v
dmesg >"$out/dmesg-hostid-not-uuid.txt" 2>&1; dmesg -c >/dev/null 2>&1
cat >/tmp/fxcfg.json <<EOC
[{"hostnqn": "nqn.2026-11.io.fx100:cfg-host", "dhchap_key": "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:",
  "subsystems": [{"nqn": "$RAM", "ports": [{"transport": "tcp", "traddr": "$A", "trsvcid": "4420",
  "dhchap_ctrl_key": "DHHC-1:00:Vse+lQXC74j55LLeogykqUyoq6cyGRWl2MHdprBpN13YAtvd:"}]}]}]
EOC
run connect-config-file nvme connect -t tcp -a $A -s 4420 -n $RAM -q nqn.2026-11.io.fx100:cfg-host -J /tmp/fxcfg.json -o json -O -v
ls /sys/class/nvme >"$out/after-config-file.ls"
run disconnect-config nvme disconnect -n $RAM
run connect-not-allowed nvme connect -t tcp -a $A -s 4420 -n $NV -q nqn.2026-11.io.fx100:not-allowed -o json
run connect-not-allowed-v nvme connect -t tcp -a $A -s 4420 -n $NV -q nqn.2026-11.io.fx100:not-allowed -o json -v
dmesg >"$out/dmesg-not-allowed.txt" 2>&1; dmesg -c >/dev/null 2>&1
run connect-no-subsys nvme connect -t tcp -a $A -s 4420 -n nqn.2026-11.io.fx100:no-such -q $H -o json
run connect-no-subsys-v nvme connect -t tcp -a $A -s 4420 -n nqn.2026-11.io.fx100:no-such -q $H -o json -v
dmesg >"$out/dmesg-no-subsys.txt" 2>&1; dmesg -c >/dev/null 2>&1
run connect-refused nvme connect -t tcp -a $A -s 4999 -n $RAM -q $H -o json -v
dmesg >"$out/dmesg-refused.txt" 2>&1; dmesg -c >/dev/null 2>&1
run connect-rdma-no-subsys nvme connect -t rdma -a $A -s 4421 -n nqn.2026-11.io.fx100:no-such -q $H -o json -v
dmesg >"$out/dmesg-rdma-no-subsys.txt" 2>&1; dmesg -c >/dev/null 2>&1
run connect-secret nvme connect -t tcp -a $A -s 4420 -n $NV -q nqn.2026-11.io.fx100:secret-host -S DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n: -o json -v
dmesg >"$out/dmesg-secret.txt" 2>&1; dmesg -c >/dev/null 2>&1
run connect-bad-opt nvme connect -t tcp -a $A -s 4420 -n $RAM -q $H --bogus
run gen-key nvme gen-dhchap-key -n $H
ls /sys/kernel/config/nvmet/hosts/ >"$out/nvmet-hosts.ls" 2>&1
for h in /sys/kernel/config/nvmet/hosts/*; do ls $h >>"$out/nvmet-hosts.ls"; done
ls /sys/module | grep -i nvme >"$out/modules.txt"
run disconnect-d nvme disconnect -d $(sed -n 's/.*"device" *: *"\(nvme[0-9]*\)".*/\1/p' "$out/connect-tcp-ram.out")
run disconnect-n nvme disconnect -n $NV
run disconnect-none nvme disconnect -n $NV
run disconnect-d-none nvme disconnect -d nvme99
run list-after nvme list -o json
ls /sys/class/nvme-subsystem/ >"$out/subsys-after.ls"
# DH-HMAC-CHAP (a kernel with NVMe in-band authentication and the lab's lab-auth subsystem)
AUTH=nqn.2026-11.io.fx100:lab-auth
AH=nqn.2026-11.io.fx100:lab-auth-host
AB=nqn.2026-11.io.fx100:lab-auth-bidir
AKEY=DHHC-1:00:Fk5BrphAEh+AKiyiFKyx9mEPahMAssuR+Alaq7JthZkNeG2K:
BKEY=DHHC-1:01:Fk5BrphAEh+AKiyiFKyx9mEPahMAssuR+Alaq7JthZkNeG2K:
BCKEY=DHHC-1:02:dnmXMOwPD0655WZ10LuG+9oL0hfAtdfRj5Qm1NlyhBYHAgmvaDWRKYgfU0YLNXEU1ikU7g==:
WRONG=DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:
if [ -d /sys/kernel/config/nvmet/subsystems/$AUTH ]; then
  dmesg -c >/dev/null 2>&1
  run connect-auth-ok nvme connect -t tcp -a $A -s 4420 -n $AUTH -q $AH -S $AKEY -o json
  n=$(sed -n 's/.*"device" *: *"\(nvme[0-9]*\)".*/\1/p' "$out/connect-auth-ok.out")
  mkdir -p "$out/sys/class/nvme-auth/$n"
  ls /sys/class/nvme/$n >"$out/sys/class/nvme-auth/$n.ls"
  for f in dhchap_secret dhchap_ctrl_secret state; do
    [ -e /sys/class/nvme/$n/$f ] && cat /sys/class/nvme/$n/$f >"$out/sys/class/nvme-auth/$n/$f"
  done
  nvme disconnect -d $n >/dev/null
  dmesg >"$out/dmesg-auth-ok.txt" 2>&1; dmesg -c >/dev/null 2>&1
  run connect-auth-wrong nvme connect -t tcp -a $A -s 4420 -n $AUTH -q $AH -S $WRONG -o json
  dmesg >"$out/dmesg-auth-wrong.txt" 2>&1; dmesg -c >/dev/null 2>&1
  run connect-auth-none nvme connect -t tcp -a $A -s 4420 -n $AUTH -q $AH -o json
  dmesg >"$out/dmesg-auth-none.txt" 2>&1; dmesg -c >/dev/null 2>&1
  run connect-auth-rdma-wrong nvme connect -t rdma -a $A -s 4421 -n $AUTH -q $AH -S $WRONG -o json
  dmesg >"$out/dmesg-auth-rdma-wrong.txt" 2>&1; dmesg -c >/dev/null 2>&1
  run connect-auth-bidir-wrong-ctrl nvme connect -t tcp -a $A -s 4420 -n $AUTH -q $AB -S $BKEY -C $AKEY -o json
  dmesg >"$out/dmesg-auth-bidir-wrong-ctrl.txt" 2>&1; dmesg -c >/dev/null 2>&1
  run connect-auth-bidir nvme connect -t tcp -a $A -s 4420 -n $AUTH -q $AB -S $BKEY -C $BCKEY -o json
  run disconnect-auth nvme disconnect -n $AUTH
  ls /sys/class/nvme >"$out/after-auth.ls"
fi
echo done >"$out/done"
