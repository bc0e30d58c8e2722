"""pytest plugin loaded by the pytest run that executes `@pytest.mark.guest` tests inside the
guest (tests/support/lab_fixture.py): it writes each test's outcome to the JSON file named by
$FX100IO_GUEST_PYTEST_REPORT, where the host's pytest reads it and reports the test as its own.
"""

from __future__ import annotations

import json
import os

REPORT_VARIABLE = "FX100IO_GUEST_PYTEST_REPORT"

_results: dict[str, dict] = {}


def pytest_runtest_logreport(report) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "message": "",
                                                "duration": 0.0})
    entry["duration"] += report.duration
    if report.failed:
        sections = "".join(f"\n--- {name} ---\n{text}" for name, text in report.sections)
        entry["outcome"] = "failed"
        entry["message"] += f"[{report.when}] {report.longreprtext}{sections}\n"
    elif report.skipped and entry["outcome"] == "passed":
        if hasattr(report, "wasxfail"):
            entry.update(outcome="xfailed", message=report.wasxfail)
        else:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            entry.update(outcome="skipped", message=reason.removeprefix("Skipped: "))


def pytest_sessionfinish(session) -> None:
    path = os.environ.get(REPORT_VARIABLE)
    if path:
        partial = f"{path}.part"
        with open(partial, "w") as out:
            json.dump(_results, out)
        os.replace(partial, path)
