#!/usr/bin/env bash
# A private Docker engine for the container-runtime tests: its own socket, data root and exec root
# under DIR, no bridge or iptables changes to the host. Also imports Kiln's base image with
# `docker import`, the way a self-hoster would.
#   dockerd.sh start DIR   -> prints the engine address (unix://DIR/docker.sock)
#   dockerd.sh stop DIR
set -euo pipefail
cmd=${1:?start|stop}
dir=${2:?directory}
root="$(cd "$(dirname "$0")/../.." && pwd)"
sock="$dir/docker.sock"

case "$cmd" in
  start)
    command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install docker.io" >&2; exit 1; }
    mkdir -p "$dir"
    if ! docker -H "unix://$sock" version >/dev/null 2>&1; then
      # containerd from the docker.io package: dockerd starts its own when none runs.
      nohup dockerd --host "unix://$sock" --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/docker.pid" \
        --iptables=false --ip6tables=false --bridge=none >"$dir/dockerd.log" 2>&1 &
      for _ in $(seq 1 150); do
        docker -H "unix://$sock" version >/dev/null 2>&1 && break
        sleep 0.2
      done
      docker -H "unix://$sock" version >/dev/null 2>&1 || { tail -20 "$dir/dockerd.log" >&2; exit 1; }
    fi
    image=${KILN_FUNCTION_IMAGE:-kiln-runtime:base}
    if ! docker -H "unix://$sock" image inspect "$image" >/dev/null 2>&1; then
      (cd "$root" && node_modules/.bin/bun cmd/kiln.ts functions base-image) | docker -H "unix://$sock" import - "$image" >/dev/null
    fi
    echo "unix://$sock"
    ;;
  stop)
    if [ -f "$dir/docker.pid" ]; then
      pid=$(cat "$dir/docker.pid")
      # Workers left behind (a test run cut short) go first, then the engine.
      docker -H "unix://$sock" ps -aq --filter label=dev.kiln.worker | xargs -r docker -H "unix://$sock" rm -f >/dev/null 2>&1 || true
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    ;;
  *) echo "usage: dockerd.sh start|stop DIR" >&2; exit 2 ;;
esac
