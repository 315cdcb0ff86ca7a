#!/bin/sh
# Kiln's sandbox for hosts without bubblewrap, built only from util-linux (unshare, mount, pivot_root,
# setpriv), which every Linux distribution ships. isolation.ts starts it as
#
#   setpriv --pdeathsig KILL -- unshare [--user --map-root-user] --mount --pid --ipc --uts [--net]
#     --kill-child --propagation private -- /bin/sh namespace-sandbox.sh PLAN... -- COMMAND...
#
# and this script, running as root of those fresh namespaces, builds a new root on a tmpfs from the
# plan (the same mount list bubblewrap gets), pivots into it, and starts the command with every
# capability dropped: as the sandbox uid when Kiln runs as root (--drop-to), else as uid 1000 of a
# nested user namespace (--map-user), like bubblewrap's --uid 1000. COMMAND begins with the seccomp
# loader (seccomp.ts). The script itself stays as the sandbox's pid 1 until the command ends.
#
# Plan words (after --root DIR): --ro-bind SRC DEST | --bind SRC DEST | --symlink TARGET DEST | --tmpfs DEST BYTES |
# --cover-dir DEST | --cover-file DEST | --proc | --dev | --hostname NAME | --chdir DIR |
# --drop-to UID GID | --map-user UID | --lo-up
set -eu
umask 022
# Its own tools from the usual places; the command gets the PATH it was given.
command_path=$PATH
PATH=/usr/sbin:/usr/bin:/sbin:/bin
die() { echo "kiln sandbox: $*" >&2; exit 125; }

# The new root: a tmpfs over an empty directory Kiln made for this (--root DIR, first), visible only
# in this mount namespace (unshare made its propagation private).
[ "${1:-}" = --root ] && [ -d "${2:-}" ] || die "usage: --root DIR PLAN... -- COMMAND..."
R=$2
shift 2
mount -t tmpfs -o mode=0755,size=1m kiln-root "$R" || die "cannot mount the sandbox root"

drop="" map="" chdir="/" host="" loup=""
parent() { mkdir -p "$R$(dirname "$1")"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --ro-bind|--bind)
      [ -e "$2" ] || die "missing mount source $2"
      parent "$3"
      if [ -d "$2" ]; then mkdir -p "$R$3"; else [ -e "$R$3" ] || : > "$R$3"; fi
      mount --rbind "$2" "$R$3" || die "cannot bind $2"
      if [ "$1" = --ro-bind ]; then mount -o remount,bind,ro "$R$3" || die "cannot make $3 read-only"; fi
      shift 3 ;;
    --symlink) parent "$3"; ln -s "$2" "$R$3"; shift 3 ;;
    --tmpfs) mkdir -p "$R$2"; mount -t tmpfs -o "mode=1777,size=$3,nosuid,nodev" kiln-tmp "$R$2"; shift 3 ;;
    --cover-dir) mkdir -p "$R$2" 2>/dev/null || true; mount -t tmpfs -o ro,size=4k,mode=0755 kiln-cover "$R$2"; shift 2 ;;
    --cover-file) mount --bind /dev/null "$R$2"; shift 2 ;;
    --proc) mkdir -p "$R/proc"; mount -t proc -o nosuid,nodev,noexec proc "$R/proc" || die "cannot mount /proc"; shift ;;
    --dev)
      mkdir -p "$R/dev"
      mount -t tmpfs -o mode=0755,size=64k,nosuid kiln-dev "$R/dev"
      for d in null zero full random urandom tty; do
        : > "$R/dev/$d"
        mount --bind "/dev/$d" "$R/dev/$d"
      done
      ln -s /proc/self/fd "$R/dev/fd"
      ln -s /proc/self/fd/0 "$R/dev/stdin"
      ln -s /proc/self/fd/1 "$R/dev/stdout"
      ln -s /proc/self/fd/2 "$R/dev/stderr"
      mkdir -p "$R/dev/shm"
      mount -t tmpfs -o mode=1777,size=16m,nosuid,nodev kiln-shm "$R/dev/shm"
      shift ;;
    --hostname) host="$2"; shift 2 ;;
    --chdir) chdir="$2"; shift 2 ;;
    --drop-to) drop="--reuid=$2 --regid=$3 --clear-groups"; shift 3 ;;
    --map-user) map="$2"; shift 2 ;;
    --lo-up) loup=1; shift ;;
    --) shift; break ;;
    *) die "unknown plan word $1" ;;
  esac
done
[ $# -gt 0 ] || die "no command"

[ -z "$host" ] || hostname "$host" 2>/dev/null || true
# A private network namespace has a loopback that is down; builds reach their proxy through it.
[ -z "$loup" ] || ip link set lo up 2>/dev/null || die "cannot bring up the sandbox's loopback (iproute2's ip is needed)"

mkdir "$R/.old"
cd "$R"
pivot_root . .old || die "pivot_root failed"
umount -l /.old
# A runtime root Kiln provisioned has util-linux and mount but no coreutils: the empty /.old stays.
rmdir /.old 2>/dev/null || true
mount -o remount,bind,ro / 2>/dev/null || true
cd "$chdir"
unset OLDPWD

# No capabilities and no way to regain any (no_new_privs); a root Kiln's sandbox also drops to the
# sandbox uid with an empty bounding set. Then, where it can, a nested user namespace in which the
# command is uid 1000 (as under bubblewrap), or else the command directly.
PATH=$command_path
export PATH
if [ -n "$drop" ]; then
  # shellcheck disable=SC2086
  if [ -n "$map" ]; then set -- setpriv $drop --inh-caps=-all --bounding-set=-all --no-new-privs -- unshare --user --map-user="$map" --map-group="$map" -- "$@"
  # shellcheck disable=SC2086
  else set -- setpriv $drop --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"; fi
else
  set -- setpriv --inh-caps=-all --no-new-privs -- unshare --user --map-user="$map" --map-group="$map" -- "$@"
fi
# The command runs as pid 2; this shell stays the sandbox's pid 1, as bubblewrap's init does. It
# reaps whatever the command leaves behind (a runtime as pid 1 reaps nothing, and unreaped zombies
# count against the process limit), and when the command ends it ends, which ends the pid namespace
# and every process in it. It keeps no descriptor of the command's (fd 3 is the worker's channel).
"$@" &
child=$!
exec 3>&- </dev/null >/dev/null 2>&1
wait "$child"
