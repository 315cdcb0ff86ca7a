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
# --drop-to UID GID | --map-user UID | --lo-up | --setup-by-loader
#
# --setup-by-loader: COMMAND's first process is the seccomp loader (Perl, seccomp.ts), and it finishes
# the sandbox itself (links, loopback, pivot_root, dropping to the sandbox uid, the nested user
# namespace): one process instead of the ten util-linux and iproute2 starts of the tail below.
set -euf # (no globbing: the batches below split lists of paths on spaces)
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

# Starting a process costs a few milliseconds (tens on a busy machine), and a mount, mkdir or ln per
# plan word made ~100 of them per sandbox. So the plan is gathered and applied in a few batches:
# directories in one `mkdir -p`, files with the shell's own `: >`, mounts as lines of an fstab run by
# one `mount --all` (X-mount.mkdir makes their directories in order; `bind,ro` is libmount's bind
# plus read-only remount), the root's merged-/usr links in one `ln -s`. A file or link that lies
# under a mount still pending is made after that mount (a batch ends there), and a path the fstab
# format cannot carry (white space, a backslash) is mounted on its own.
TAB="$R/.old/fstab"
tab="" targets="" dirs="$R/.old" files="" rootlinks="" links=""
loader="" latelinks=""
for a; do
  case "$a" in --setup-by-loader) loader=1 ;; --) break ;; esac
done
# The pending batch: mkdir, files, links, then the mounts.
flush() {
  # shellcheck disable=SC2086
  [ -z "$dirs" ] || mkdir -p $dirs || die "cannot make mount points"
  for f in $files; do [ -e "$f" ] || : > "$f"; done
  # shellcheck disable=SC2086
  [ -z "$rootlinks" ] || (cd "$R" && ln -s $rootlinks .) || die "cannot make the root's links"
  while [ -n "$links" ]; do
    one=${links%%
*}
    links=${links#*
}
    ln -s "${one%% *}" "${one#* }" || die "cannot link ${one#* }"
  done
  if [ -n "$tab" ]; then
    printf '%s' "$tab" > "$TAB"
    mount --all --fstab "$TAB" || die "cannot mount the sandbox's file system"
  fi
  tab="" targets="" dirs="" files="" rootlinks="" links=""
}
# Whether a path needs a mount of the pending batch first (it lies under one's target).
under_pending() {
  for t in $targets; do
    case "$1" in "$t"/*) return 0 ;; esac
  done
  return 1
}
plain() { case "$1" in *[[:space:]\\]*) return 1 ;; esac; return 0; }
# A path through one of the root's links the loader would make at the end (/lib/x with /lib ->
# usr/lib): those links are made now instead, by the next batch, as without the loader.
late_check() {
  for t in $latelinks; do
    case "$1" in "$R/${t##*/}"/*) rootlinks="$rootlinks $latelinks" latelinks=""; return ;; esac
  done
}
# mnt SOURCE TARGET TYPE OPTIONS: a line of the batch, or at once for a path fstab cannot hold.
mnt() {
  late_check "$2"
  if plain "$1" && plain "$2"; then
    tab="$tab$1 $2 $3 $4 0 0
"
    targets="$targets $2"
  else
    flush
    case "$4" in *X-mount.mkdir*) mkdir -p "$2" ;; esac
    o=$(printf '%s' "$4" | sed 's/,*X-mount.mkdir//')
    if [ "$3" = none ]; then
      mount -o "$o" "$1" "$2" || die "cannot bind $1"
    else
      mount -t "$3" -o "$o" "$1" "$2" || die "cannot mount $2"
    fi
  fi
}
# A file (or link) of the root's tmpfs at DEST, made before the batch's mounts.
file_at() {
  late_check "$1"
  if under_pending "$1" || ! plain "$1"; then flush; fi
  d=${1%/*}
  if plain "$1"; then
    [ -z "$d" ] || dirs="$dirs $d"
    files="$files $1"
  else
    mkdir -p "$d"
    [ -e "$1" ] || : > "$1"
  fi
}

drop="" map="" chdir="/" host="" loup="" devlinks=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ro-bind|--bind)
      [ -e "$2" ] || die "missing mount source $2"
      if [ "$1" = --ro-bind ]; then opts=rbind,ro; else opts=rbind; fi
      if [ -d "$2" ]; then mnt "$2" "$R$3" none "$opts,X-mount.mkdir"; else file_at "$R$3"; mnt "$2" "$R$3" none "$opts"; fi
      shift 3 ;;
    --symlink)
      if [ "${3%/*}" = "" ] && [ "/${2##*/}" = "$3" ] && plain "$2"; then
        # /bin -> usr/bin and its kind: one `ln -s` for all of them, or made by the loader.
        if [ -n "$loader" ]; then latelinks="$latelinks $2"; else rootlinks="$rootlinks $2"; fi
      else
        if ! plain "$R$3" || ! plain "$2"; then
          flush
          mkdir -p "$R${3%/*}"
          ln -s "$2" "$R$3" || die "cannot link $3"
        else
          if under_pending "$R$3"; then flush; fi
          [ -z "${3%/*}" ] || dirs="$dirs $R${3%/*}"
          links="$links$2 $R$3
"
        fi
      fi
      shift 3 ;;
    --tmpfs) mnt kiln-tmp "$R$2" tmpfs "mode=1777,size=$3,nosuid,nodev,X-mount.mkdir"; shift 3 ;;
    --cover-dir) mnt kiln-cover "$R$2" tmpfs "ro,size=4k,mode=0755,X-mount.mkdir"; shift 2 ;;
    --cover-file) mnt /dev/null "$R$2" none bind; shift 2 ;;
    --proc) mnt proc "$R/proc" proc "nosuid,nodev,noexec,X-mount.mkdir"; shift ;;
    --dev)
      mnt kiln-dev "$R/dev" tmpfs "mode=0755,size=64k,nosuid,X-mount.mkdir"
      flush
      for d in null zero full random urandom tty; do
        : > "$R/dev/$d"
        mnt "/dev/$d" "$R/dev/$d" none bind
      done
      [ -n "$loader" ] || links="/proc/self/fd $R/dev/fd
/proc/self/fd/0 $R/dev/stdin
/proc/self/fd/1 $R/dev/stdout
/proc/self/fd/2 $R/dev/stderr
"
      devlinks=1
      mnt kiln-shm "$R/dev/shm" tmpfs "mode=1777,size=16m,nosuid,nodev,X-mount.mkdir"
      shift ;;
    --hostname) host="$2"; shift 2 ;;
    --chdir) chdir="$2"; shift 2 ;;
    --drop-to) drop="--reuid=$2 --regid=$3 --clear-groups" drop_ids="$2 $3"; shift 3 ;;
    --map-user) map="$2"; shift 2 ;;
    --lo-up) loup=1; shift ;;
    --setup-by-loader) shift ;;
    --) shift; break ;;
    *) die "unknown plan word $1" ;;
  esac
done
flush
[ $# -gt 0 ] || die "no command"

# (The new UTS namespace's name, written without starting a process; hostname(1) where that fails.)
[ -z "$host" ] || printf '%s' "$host" 2>/dev/null >/proc/sys/kernel/hostname || hostname "$host" 2>/dev/null || true

if [ -n "$loader" ]; then
  # What the tools do below, in the loader's own process (seccomp.ts reads these lines and removes
  # them from the command's environment).
  setup="root $R
chdir $chdir"
  [ -z "$latelinks" ] || setup="$setup
rootlinks${latelinks}"
  [ -z "$devlinks" ] || setup="$setup
devlinks"
  [ -z "$loup" ] || setup="$setup
lo"
  [ -z "$drop" ] || setup="$setup
drop $drop_ids"
  [ -z "$map" ] || setup="$setup
map $map"
  KILN_SANDBOX_SETUP=$setup
  export KILN_SANDBOX_SETUP
else
  rm -f "$TAB"
  # A private network namespace has a loopback that is down; builds reach their proxy through it.
  [ -z "$loup" ] || ip link set lo up 2>/dev/null || die "cannot bring up the sandbox's loopback (iproute2's ip is needed)"

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
  if [ -n "$drop" ]; then
    # shellcheck disable=SC2086
    if [ -n "$map" ]; then set -- setpriv $drop --inh-caps=-all --bounding-set=-all --no-new-privs -- unshare --user --map-user="$map" --map-group="$map" -- "$@"
    # shellcheck disable=SC2086
    else set -- setpriv $drop --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"; fi
  else
    set -- setpriv --inh-caps=-all --no-new-privs -- unshare --user --map-user="$map" --map-group="$map" -- "$@"
  fi
fi
PATH=$command_path
export PATH
# The command runs as pid 2; this shell stays the sandbox's pid 1, as bubblewrap's init does. It
# reaps whatever the command leaves behind (a runtime as pid 1 reaps nothing, and unreaped zombies
# count against the process limit), and when the command ends it ends, which ends the pid namespace
# and every process in it. It keeps no descriptor of the command's (fd 3 is the worker's channel).
"$@" &
child=$!
exec 3>&- </dev/null >/dev/null 2>&1
wait "$child"
