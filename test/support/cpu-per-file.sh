#!/usr/bin/env bash
# What each test file costs: runs every file of the given vitest projects alone, one after another,
# and prints "project file exit-code user-s sys-s wall-s" (CPU of vitest and the Kilns it started;
# not of servers that detach, such as the postgres project's PostgreSQL). The suite is CPU-bound on a
# 2-core runner, so this, not a file's wall time in a parallel run, says where the minutes go.
# Usage: bash test/support/cpu-per-file.sh [projects...]   (default: unit embedded postgres s3)
set -uo pipefail
cd "$(dirname "$0")/../.."
projects=("$@")
[ ${#projects[@]} -eq 0 ] && projects=(unit embedded postgres s3)
bun=node_modules/.bin/bun
for p in "${projects[@]}"; do
  for f in $($bun x --bun vitest list --filesOnly --project "$p" 2>/dev/null | sed -n 's/^\[[^]]*\] //p'); do
    t=$(mktemp)
    KILN_NODE_INSTALL=off /usr/bin/time -f "%U %S %e" -o "$t" $bun x --bun vitest run --project "$p" "$f" > /dev/null 2>&1
    echo "$p $f $? $(tail -1 "$t")"
    rm -f "$t"
  done
done
