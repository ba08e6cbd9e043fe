#!/usr/bin/env bash
# `apptainer` for a host that has none (Debian 12 has no package): Apptainer from Debian unstable,
# run from a root of its own that this script makes once with debootstrap (~400 MB, half a minute
# where Debian's package service is reachable) and keeps in APPTAINER_ROOT.
#
#   tools/apptainer.sh build mlperf-hpc-tf-cpu.sif docker/mlperf-hpc-cpu.def
#   tools/apptainer.sh exec --no-home --bind /data mlperf-hpc-tf-cpu.sif python ...
#   APPTAINER=tools/apptainer.sh CONTAINER=... sbatch slurm/cosmoflow.sbatch
#
# The command line is apptainer's own. Root only (bind mounts, pivot_root). In a mount namespace of its
# own it binds into the root, at the same paths: /proc, /sys, /dev, /tmp, /run, the working
# directory, PMIx's and SLURM's directories named by the environment (PMIX_SERVER_TMPDIR,
# PMIX_SYSTEM_TMPDIR, DOCKER_HOST's socket), and every existing path the arguments name (the image,
# --bind sources, a .def, the output's folder); then runs apptainer there in the working directory.
# Every process of the chain execs the next, so srun's signals reach apptainer itself.
#
#   APPTAINER_ROOT    the root (default /var/tmp/mlperf-hpc-apptainer-sid)
#   APPTAINER_MIRROR  Debian's package service (default http://deb.debian.org/debian)
set -euo pipefail
root=$(realpath -m "${APPTAINER_ROOT:-/var/tmp/mlperf-hpc-apptainer-sid}")
mirror=${APPTAINER_MIRROR:-http://deb.debian.org/debian}

fail() { echo "error: tools/apptainer.sh: $*" >&2; exit 1; }

make_root() {  # once; concurrent callers (a node's srun tasks) wait for the first
    command -v debootstrap >/dev/null || fail "debootstrap not found (apt-get install debootstrap)"
    mkdir -p "$(dirname "$root")"
    exec 9>"$root.lock"
    flock 9
    [[ -x $root/usr/bin/apptainer ]] && return
    rm -rf "$root.partial"
    echo "[apptainer] making $root: debootstrap sid with apptainer from $mirror" >&2
    if ! debootstrap --variant=minbase --include=apptainer sid "$root.partial" "$mirror" \
        >"$root.log" 2>&1; then
        fail "cannot make the Apptainer root $root from $mirror (debootstrap failed; see $root.log)"
    fi
    rm -rf "$root.partial/var/cache/apt/archives"/*.deb
    mv "$root.partial" "$root"
}

bind() {  # PATH: the host's PATH at the same path in the root (a file: its folder)
    local path=$1
    [[ -d $path ]] || path=$(dirname "$path")
    case $path in  # the root's own system stays its own
        / | /usr | /usr/* | /bin | /bin/* | /sbin | /sbin/* | /lib | /lib/* | /lib64 | /lib64/* | \
            /etc | /etc/* | /var | /boot | /boot/*) return ;;
    esac
    mountpoint -q "$root$path" 2>/dev/null && return
    mkdir -p "$root$path"
    mount --rbind "$path" "$root$path"
}

if [[ -z ${_APPTAINER_SH_NAMESPACE:-} ]]; then
    [[ $(id -u) == 0 ]] || fail "needs root (bind mounts, pivot_root); use a host apptainer otherwise"
    command -v unshare >/dev/null || fail "unshare not found (util-linux)"
    [[ -x $root/usr/bin/apptainer ]] || make_root
    _APPTAINER_SH_NAMESPACE=1 exec unshare --mount --propagation private "$0" "$@"
fi
unset _APPTAINER_SH_NAMESPACE

# The root a mount point of its own: Apptainer sets the propagation of / (EINVAL on a plain folder).
mount --bind "$root" "$root"
for path in /proc /sys /dev /tmp /run "$PWD" ${PMIX_SERVER_TMPDIR:-} ${PMIX_SYSTEM_TMPDIR:-}; do
    bind "$path"
done
[[ ${DOCKER_HOST:-} != unix://* ]] || bind "${DOCKER_HOST#unix://}"
for file in /etc/passwd /etc/group /etc/hosts /etc/resolv.conf; do
    [[ -f $file ]] && touch "$root$file" && mount --bind "$file" "$root$file"
done
for arg in "$@"; do  # --bind a,b:/c  -> a and b; image.sif; out/new.sif -> out
    IFS=, read -ra parts <<<"$arg"
    for part in "${parts[@]}"; do
        [[ -n $part && $part != -* ]] || continue
        path=$(realpath -m -- "${part%%:*}")
        if [[ -e $path ]]; then
            bind "$path"
        elif [[ -d $(dirname "$path") && $part == */* ]]; then
            bind "$(dirname "$path")"
        fi
    done
done
# Apptainer gives root every capability the kernel has and stops where the host's root lacks one
# (a VM sandbox without CAP_SYS_RESOURCE): drop those, and only those, from what it asks.
names=(chown dac_override dac_read_search fowner fsetid kill setgid setuid setpcap linux_immutable
    net_bind_service net_broadcast net_admin net_raw ipc_lock ipc_owner sys_module sys_rawio
    sys_chroot sys_ptrace sys_pacct sys_admin sys_boot sys_nice sys_resource sys_time
    sys_tty_config mknod lease audit_write audit_control setfcap mac_override mac_admin syslog
    wake_alarm block_suspend audit_read perfmon bpf checkpoint_restore)
bounding=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
missing=()
for i in "${!names[@]}"; do
    (( bounding >> i & 1 )) || missing+=("CAP_${names[i]^^}")
done
if (( ${#missing[@]} )); then
    APPTAINER_DROP_CAPS=$(IFS=,; echo "${missing[*]}${APPTAINER_DROP_CAPS:+,$APPTAINER_DROP_CAPS}")
    export APPTAINER_DROP_CAPS
fi

# pivot_root, not chroot: Apptainer refuses to run in a chroot ("weak chrooted environment").
mkdir -p "$root/.host"
cd "$root"
pivot_root . .host
umount --lazy /.host
exec /usr/bin/env --chdir="$OLDPWD" apptainer "$@"
