#!/usr/bin/python3
"""Every CTest test carries exactly one stage label: unit (no daemon; the fast
first stage, `ctest -L unit`), integration (starts its own tgtd or mount) or
vm (boots a QEMU guest). Lists the tests that do not, and fails.

Usage: labels_test.py <ctest> <build dir>
"""
import json
import subprocess
import sys

STAGES = {"unit", "integration", "vm"}

ctest, build = sys.argv[1], sys.argv[2]
listing = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, check=True,
                         capture_output=True, text=True).stdout
bad = []
for test in json.loads(listing)["tests"]:
    labels = next((p["value"] for p in test.get("properties", [])
                   if p["name"] == "LABELS"), [])
    stages = STAGES.intersection(labels)
    if len(stages) != 1:
        bad.append(f"{test['name']} (labels: {', '.join(labels) or 'none'})")
if bad:
    sys.exit("labels_test: tests without exactly one of unit, integration, vm "
             "(set_tests_properties(... LABELS unit) or gtest_discover_tests("
             "... PROPERTIES LABELS unit)):\n  " + "\n  ".join(bad))
print(f"labels_test: {len(json.loads(listing)['tests'])} tests, each with one stage label")
