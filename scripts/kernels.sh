# The kernels the VMs boot, and how to get them: sourced by
# scripts/test-kernels (the integration suite in each) and scripts/vm-run
# (one command in one, e.g. bench/run gateway's encrypted comparison).
# Sets $cache (downloaded packages and virtme-ng: $HOSTMESH_KERNEL_CACHE,
# default /var/tmp/hostmesh-kernels) and $unpacked (the kernels, unpacked
# under /tmp, where virtme-ng finds their modules); installs qemu and
# virtme-ng when missing.

cache=${HOSTMESH_KERNEL_CACHE:-/var/tmp/hostmesh-kernels}
unpacked=/tmp/hostmesh-kernels
mkdir -p "$cache/debs" "$unpacked"

# kernel -> "package suite lacks"; suite "bookworm" uses this machine's apt
# sources, "bullseye" a sources list of its own. (What the host lacks is
# left to the suite's own oracle, its kernel's version.)
declare -A KERNELS=(
    [host]="- - -"
    [6.1]="linux-image-6.1.0-57-amd64 bookworm tcx"
    [6.12]="linux-image-6.12.117+deb12-amd64 bookworm -"
    [5.10]="linux-image-5.10.0-46-amd64 bullseye tcx,netns_cookie_sockopt,set_retval,tunnel_source,coarse_clock"
)
tools=(qemu-system-x86 busybox-static kmod python3-venv)
missing=()
for p in "${tools[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "${0##*/}: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -x "$cache/vng/bin/vng" ]; then
    echo "${0##*/}: installing virtme-ng 1.42 in $cache/vng"
    python3 -m venv "$cache/vng"
    "$cache/vng/bin/pip" install -q virtme-ng==1.42
fi
export PATH="$cache/vng/bin:$PATH"

# apt-get with its own lists, for suites this machine does not use.
apt_for() {
    local suite=$1
    if [ "$suite" = bookworm ]; then
        echo apt-get
        return
    fi
    local dir=$cache/apt-$suite
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    cat > "$dir/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security $suite-security main
EOF
    echo apt-get -o Dir::Etc::sourcelist="$dir/sources.list" -o Dir::Etc::sourceparts=- \
        -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache"
}

# The kernel image of a package, downloaded and unpacked if needed.
kernel_image() {
    local package=$1 suite=$2
    local dir=$unpacked/$package
    if ! ls "$dir"/boot/vmlinuz-* >/dev/null 2>&1; then
        local deb
        deb=$(ls "$cache/debs/${package}_"*.deb 2>/dev/null | head -1 || true)
        if [ -z "$deb" ]; then
            local apt
            apt=$(apt_for "$suite")
            $apt update -qq
            (cd "$cache/debs" && $apt download "$package" >/dev/null 2>&1) ||
                { echo "${0##*/}: cannot download $package" >&2; return 1; }
            deb=$(ls "$cache/debs/${package}_"*.deb | head -1)
        fi
        rm -rf "$dir" && mkdir -p "$dir"
        dpkg -x "$deb" "$dir"
    fi
    ls "$dir"/boot/vmlinuz-* | head -1
}


# How every VM boots: 2 CPUs under emulation (KVM here runs only kernels
# built for it), 4 GiB, the host's filesystem over 9p, root.
vng_args=(--verbose --user root --memory 4G --cpus 2 --force-9p --disable-kvm)

# The first lines of the script a VM runs: a bpffs where systemd would
# mount one, and Debian's WireGuard module (the encrypted-peer tests and
# bench/gateway's encrypted row expect it on every kernel booted here).
vm_preamble() {
    echo '#!/bin/bash'
    echo 'mkdir -p /sys/fs/bpf && mount -t bpf bpf /sys/fs/bpf'
    echo 'modprobe wireguard || echo "run.sh: cannot load the wireguard module" >&2'
}
