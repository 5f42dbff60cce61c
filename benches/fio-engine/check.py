#!/usr/bin/env python3
"""Checks one fio run of a job file on the plugio engine, from fio's JSON.

    check.py [--expect-error ERRNO] [--expect-text TEXT]... [--expect-regex RE]...
             RESULT.json STDERR

Without --expect-error every job must end with error 0, have moved data
(read, write or trim bytes > 0) through the external plugio engine, and, for a
job with verify set and do_verify on, have read data back (the verify
pass); STDERR must have no verify or io_u error line. With --expect-error
ERRNO every job must end with exactly that error (the run failed
cleanly: fio wrote its JSON, no crash, no hang). Either way STDERR must
contain each --expect-text and match each --expect-regex (plugio's
iostats line, printed there with plugio_stats=1, shows fixed-buffer IO,
merges and bounces). Exit status 0 when all holds, 1 with the reasons.
"""

import argparse
import json
import re
import sys


def load(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    # fio prints notes before the JSON object when --output is not used.
    start = text.find("{")
    if start < 0:
        raise ValueError(f"{path}: no JSON object (did fio crash?)")
    return json.loads(text[start:])


def check_ok(job, global_opts, problems):
    name = job["jobname"]
    opts = dict(global_opts)
    opts.update(job.get("job options", {}))
    if not opts.get("ioengine", "").startswith("external:"):
        problems.append(f"{name}: ioengine is {opts.get('ioengine')!r}, not the plugio engine")
    if job["error"] != 0:
        problems.append(f"{name}: error {job['error']}")
    moved = job["read"]["io_bytes"] + job["write"]["io_bytes"] + job["trim"]["io_bytes"]
    if moved <= 0:
        problems.append(f"{name}: no data moved")
    verify = opts.get("verify", "0") not in ("0", "none")
    if verify and opts.get("do_verify", "1") != "0" and job["read"]["io_bytes"] <= 0:
        problems.append(f"{name}: verify set but nothing was read back")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect-error", type=int, default=0)
    ap.add_argument("--expect-text", action="append", default=[])
    ap.add_argument("--expect-regex", action="append", default=[])
    ap.add_argument("result")
    ap.add_argument("stderr")
    args = ap.parse_args()
    problems = []
    try:
        result = load(args.result)
    except (OSError, ValueError) as e:
        print(f"FAIL {args.result}: {e}")
        return 1
    with open(args.stderr, encoding="utf-8", errors="replace") as f:
        err = f.read()
    jobs = result.get("jobs", [])
    if not jobs:
        problems.append("no jobs in the JSON")
    for job in jobs:
        if args.expect_error:
            if job["error"] != args.expect_error:
                problems.append(
                    f"{job['jobname']}: error {job['error']}, expected {args.expect_error}"
                )
        else:
            check_ok(job, result.get("global options", {}), problems)
    if not args.expect_error:
        for line in err.splitlines():
            if "verify:" in line or "io_u error" in line or "bad magic" in line:
                problems.append(f"stderr: {line.strip()}")
    for text in args.expect_text:
        if text not in err:
            problems.append(f"stderr lacks {text!r}")
    for pattern in args.expect_regex:
        if not re.search(pattern, err):
            problems.append(f"stderr does not match {pattern!r}")
    names = ", ".join(sorted({j["jobname"] for j in jobs}))
    if problems:
        print(f"FAIL {args.result} ({names}):")
        for p in problems:
            print(f"  {p}")
        return 1
    what = f"error {args.expect_error} as expected" if args.expect_error else "0 errors"
    print(f"ok   {args.result} ({names}): {len(jobs)} job(s), {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
