#!/usr/bin/env python3
# STAND-IN for Habana's ReportNCheck (tests only; not the real tool). In a directory of its own, as the real one
# comes with the RDMA PerfTest tool, so that a test chooses whether a host has it (on PATH or not).
# Settings:
#   GAUDI_STANDIN_REPORTNCHECK  pass (default), fail (one Gaudi NIC port fails the check) or hang (never answers)
#
# Source: Habana, "Intel Gaudi ReportNCheck Tool",
# https://docs.habana.ai/en/latest/Management_and_Monitoring/ReportNCheck_Tool/ReportNCheck_Tool.html
# - from the page: the name and how it is run (`python3 reportNcheck.py`, Python, pandas its prerequisite), and
#   its options: -h/--help ("Shows the help message and exits": argparse's wording, so an unknown flag fails as
#   argparse fails it, usage on stderr and exit 2), -c/--check (Gaudi/host NIC connectivity), -v (detailed
#   report), -q/--quad QUAD (1 or 2), -d/--device DEVICE (device:port such as hbl_0:24 or mlx5_1:1). The stored
#   page is cut after -d; any later options are missing here.
# - MADE UP (the page shows no output and no exit status): every line printed below, and exit 1 for a failed
#   check. The port (hbl_1:9, a Gaudi 2 scale-out port as hl-smi's stand-in numbers them) is invented too.
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser(prog="reportNcheck.py")
parser.add_argument("-c", "--check", action="store_true", help="Checks Gaudi/host NIC connectivity.")
parser.add_argument("-v", action="store_true", help="Reports detailed information.")
parser.add_argument("-q", "--quad", type=int, choices=(1, 2))
parser.add_argument("-d", "--device")
args = parser.parse_args()

mode = os.environ.get("GAUDI_STANDIN_REPORTNCHECK", "pass")
if not args.check:
    print("Server: stand-in, 8 Gaudi devices")
    sys.exit(0)
if mode == "hang":
    time.sleep(3600)
print("Checking Gaudi NIC connectivity ...")
if mode == "fail":
    print("hbl_1:9 -> hbl_5:9: no response")
    print("Connectivity check FAILED: 1 of 24 ports (hbl_1:9)")
    sys.exit(1)
print("Connectivity check PASSED: 24 of 24 ports")
