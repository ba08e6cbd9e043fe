"""Where a test run's time went: the JSON lines tests/conftest.py writes under TEST_COST_LOG.

    python tools/test_costs.py runs/ci/costs.jsonl [--top 15]

Prints each module's wall seconds (its tests' setup, call and teardown summed) and test count, the
longest modules first, then the longest tests. With one pytest process the machine's busy CPU
seconds are each test's own cost and are printed too; with two or more they overlap, so only the
wall seconds say anything.
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=15, help="how many modules and tests to list")
    args = parser.parse_args(argv)
    try:
        lines = args.log.read_text().splitlines()
    except OSError as e:
        print(f"error: {args.log}: {e.strerror}", file=sys.stderr)
        return 1
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line) if line.strip() else None
            if record is not None:
                records.append(
                    {
                        "test": str(record["test"]),
                        "wall_s": float(record["wall_s"]),
                        "machine_cpu_s": float(record["machine_cpu_s"]),
                        "worker": str(record["worker"]),
                    }
                )
        except (ValueError, TypeError, KeyError) as e:
            print(
                f"error: {args.log}: line {number}: not a test record ({type(e).__name__}: {e})",
                file=sys.stderr,
            )
            return 1
    if not records:
        print(f"error: {args.log}: no test recorded", file=sys.stderr)
        return 1
    alone = len({r["worker"] for r in records}) == 1
    modules = defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        m = modules[r["test"].split("::")[0]]
        m[0] += r["wall_s"]
        m[1] += r["machine_cpu_s"]
        m[2] += 1
    total_wall = sum(m[0] for m in modules.values())
    cpu_head = f"{'CPU s':>9}" if alone else ""
    print(
        f"[costs] {len(records)} tests, {total_wall:.0f} s of test wall time over "
        f"{len({r['worker'] for r in records})} process(es); the {args.top} longest modules:"
    )
    print(f"  {'module':<48}{'tests':>6}{'wall s':>9}{cpu_head}")
    for name, (wall, cpu, count) in sorted(modules.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {name:<48}{count:>6}{wall:>9.0f}" + (f"{cpu:>9.0f}" if alone else ""))
    print(f"[costs] the {args.top} longest tests:")
    for r in sorted(records, key=lambda r: -r["wall_s"])[: args.top]:
        print(
            f"  {r['wall_s']:>8.0f} s  {r['test']}"
            + (f"  ({r['machine_cpu_s']:.0f} CPU s)" if alone else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
