#!/usr/bin/env bash
# A private Podman API service for the container-runtime tests: its own socket, storage root and run
# root under DIR. No image is imported: Kiln imports its base image itself when the engine lacks it.
#   podman.sh start DIR   -> prints the engine address (unix://DIR/podman.sock)
#   podman.sh stop DIR
set -euo pipefail
cmd=${1:?start|stop}
dir=${2:?directory}
sock="$dir/podman.sock"
pm=(podman --root "$dir/root" --runroot "$dir/run")

case "$cmd" in
  start)
    command -v podman >/dev/null || { echo "podman not found: apt-get install podman" >&2; exit 1; }
    mkdir -p "$dir"
    if [ ! -S "$sock" ]; then
      nohup "${pm[@]}" system service --time=0 "unix://$sock" >"$dir/podman.log" 2>&1 &
      echo $! >"$dir/podman.pid"
      for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
      [ -S "$sock" ] || { tail -20 "$dir/podman.log" >&2; exit 1; }
    fi
    echo "unix://$sock"
    ;;
  stop)
    "${pm[@]}" rm -af >/dev/null 2>&1 || true
    if [ -f "$dir/podman.pid" ]; then
      pid=$(cat "$dir/podman.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    # Storage may hold overlay mounts; unmount before the folder is removed.
    "${pm[@]}" system reset -f >/dev/null 2>&1 || true
    ;;
  *) echo "usage: podman.sh start|stop DIR" >&2; exit 2 ;;
esac
