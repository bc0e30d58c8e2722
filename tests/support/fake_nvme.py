"""A stand-in for nvme-cli in unit tests of fx100io.kernel (tests/kernel/test_kernel_unit.py): it
replays what the real nvme-cli 2.3 printed (tests/data/nvme_cli) and changes a fake sysfs
the way the kernel would.

The scenario is a JSON file named by FAKE_NVME_SCENARIO: {"connect": {"stdout": ...,
"stderr": ..., "rc": ..., "kmsg": [lines], "create": {"nvme1": {attr: value}},
"namespaces": {"nvme1": "nvme1c1n1"}, "sleep": seconds}, "list-ns": {...}, "discover": {...}}; a list of such steps for a command
plays one per call, in order.  Every call
appends {"argv": [...], "config": <the --config file's JSON, if any>} to FAKE_NVME_LOG.
"""

import json
import os
import sys
from pathlib import Path

argv = sys.argv[1:]
scenario = json.loads(Path(os.environ["FAKE_NVME_SCENARIO"]).read_text())
sysfs = Path(os.environ["FAKE_NVME_SYSFS"])
devdir = Path(os.environ["FAKE_NVME_DEV"])
entry = {"argv": argv, "config": None}
for a in argv:
    if a.startswith("--config="):
        path = a.split("=", 1)[1]
        entry["config"] = json.loads(Path(path).read_text())
        entry["config_mode"] = oct(os.stat(path).st_mode & 0o777)
with open(os.environ["FAKE_NVME_LOG"], "a") as f:
    f.write(json.dumps(entry) + "\n")

cmd = argv[0]
if cmd == "disconnect":
    name = argv[argv.index("--device") + 1]
    d = sysfs / "class" / "nvme" / name
    if d.exists():
        for p in sorted(d.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        d.rmdir()
    else:
        print(f"Did not find device {name}", file=sys.stderr)
    sys.exit(0)

step = scenario.get(cmd, {})
if isinstance(step, list):  # one step per call of cmd, in order (several paths' connects)
    with open(os.environ["FAKE_NVME_LOG"]) as f:
        n = sum(json.loads(line)["argv"][0] == cmd for line in f) - 1
    step = step[min(n, len(step) - 1)]
if step.get("sleep"):  # a slow connect
    import time
    time.sleep(step["sleep"])
for name, attrs in step.get("create", {}).items():
    d = sysfs / "class" / "nvme" / name
    d.mkdir(parents=True)
    for k, v in attrs.items():
        (d / k).write_text(v + "\n")
    for path_name in step.get("namespaces", {}).get(name, []):
        (d / path_name).mkdir()
with open(devdir / "kmsg", "a") as f:
    for i, line in enumerate(step.get("kmsg", [])):
        f.write(f"6,{1000 + i},{i},-;{line}\n")
sys.stdout.write(step.get("stdout", ""))
sys.stderr.write(step.get("stderr", ""))
sys.exit(step.get("rc", 0))
