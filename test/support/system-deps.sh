#!/usr/bin/env bash
# What the test suite needs from the system, installed from Debian when it is missing and this runs
# as root with apt-get (a fresh machine, CI); otherwise it names what to install. `npm test` runs it
# first (pretest), so the README's test command holds on a fresh machine; .ci/run runs it too.
#   postgresql  the production-profile project starts a throwaway server from its binaries; psql and
#               pgbench (postgresql-client) are the clients the database suites drive
#   bubblewrap  isolates function workers and builds (the isolation tests assert it)
#   docker.io   the container runtime's engine ("containers" project)
#   podman      the same on Podman ("containers-podman" project)
#   ruby        Debian's Ruby exercises the Ruby bootstrap
#   python3-psycopg python3-asyncpg python3-sqlalchemy  Python's PostgreSQL clients (psycopg 3, asyncpg,
#               SQLAlchemy), driven by Debian's /usr/bin/python3 in test/http/database-protocol.test.ts
#   radosgw, ceph-mon, ceph-osd  Ceph's S3 gateway over a one-node cluster: the S3 server the blob-store
#               tests start on loopback (test/support/s3-server.ts, docs/storage.md)
#   chromium    Debian's Chromium (/usr/bin/chromium), driven headless by playwright-core in the browser
#               tests of the OAuth sign-in pages (test/support/browser.ts); npm's browser downloads are not used
#   mmdebstrap  builds the Python/Ruby runtime roots from Debian (runtime-sandbox/runtime-roots.ts): the
#               pretest's `runtimes.ts prepare` and test/http/function-runtimes.test.ts
#   jq          the README's walkthrough reads the credentials and keys it prints with jq (readme.test.ts)
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
{ command -v psql && command -v pgbench; } >/dev/null 2>&1 || need+=(postgresql postgresql-client)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v ruby >/dev/null 2>&1 || need+=(ruby)
/usr/bin/python3 -c 'import psycopg, asyncpg, sqlalchemy' >/dev/null 2>&1 || need+=(python3-psycopg python3-asyncpg python3-sqlalchemy)
{ command -v radosgw && command -v ceph-mon && command -v ceph-osd; } >/dev/null 2>&1 || need+=(radosgw ceph-mon ceph-osd)
command -v jq >/dev/null 2>&1 || need+=(jq)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing what the tests need from Debian: ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
else
  echo "warning: the tests need ${need[*]} (apt-get install ${need[*]}); the projects that use them will fail" >&2
fi
