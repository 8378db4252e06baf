#!/bin/bash
# cube-xfs-pool.sh — a loop-mounted XFS (reflink=1) pool for cube-snapshotter on
# machines whose root filesystem cannot reflink (ext4 and most others).
#
#   cube-xfs-pool.sh create IMAGE MOUNTPOINT SIZE   e.g. create /var/lib/cube-pool.img /var/lib/cube-snapshotter 200G
#   cube-xfs-pool.sh destroy IMAGE MOUNTPOINT       unmount (loop device detaches) and delete IMAGE
#   cube-xfs-pool.sh status MOUNTPOINT              show filesystem and whether it reflinks
#   cube-xfs-pool.sh fstab IMAGE MOUNTPOINT         print an /etc/fstab line that mounts it at boot
#
# IMAGE is sparse: SIZE is a ceiling, disk is used as images are written.
# Needs root, xfsprogs (mkfs.xfs) and loop devices.
set -euo pipefail

die() { echo "cube-xfs-pool: $*" >&2; exit 1; }

create() {
	local img=$1 mnt=$2 size=$3
	[[ $EUID -eq 0 ]] || die "must run as root"
	command -v mkfs.xfs >/dev/null || die "mkfs.xfs not found (apt-get install xfsprogs)"
	[[ -e /dev/loop-control ]] || die "no /dev/loop-control: loop devices unavailable"
	[[ -e $img ]] && die "$img exists; refusing to overwrite"
	if mountpoint -q "$mnt"; then die "$mnt is already a mount point"; fi
	mkdir -p "$(dirname "$img")" "$mnt"
	truncate -s "$size" "$img"
	if ! mkfs.xfs -q -m reflink=1 "$img"; then rm -f "$img"; die "mkfs.xfs failed"; fi
	if ! mount -t xfs -o loop "$img" "$mnt"; then rm -f "$img"; die "mount failed"; fi
	chmod 0700 "$mnt"
	echo "pool $img ($size, sparse) mounted at $mnt"
	status "$mnt"
}

destroy() {
	local img=$1 mnt=$2
	[[ $EUID -eq 0 ]] || die "must run as root"
	if mountpoint -q "$mnt"; then umount "$mnt"; fi
	# mount -o loop sets autoclear; detach explicitly in case it was attached by hand.
	losetup -j "$img" -O NAME --noheadings 2>/dev/null | while read -r dev; do losetup -d "$dev"; done
	rm -f "$img"
	echo "pool $img removed"
}

status() {
	local mnt=$1 probe
	findmnt -no SOURCE,FSTYPE,SIZE,USED "$mnt" || die "$mnt is not mounted"
	probe=$(mktemp -p "$mnt" .probe.XXXXXX)
	echo x >"$probe"
	if cp --reflink=always "$probe" "$probe.clone" 2>/dev/null; then echo "reflink: yes"; else echo "reflink: NO"; fi
	rm -f "$probe" "$probe.clone"
}

case ${1:-} in
create) [[ $# -eq 4 ]] || die "usage: $0 create IMAGE MOUNTPOINT SIZE"; create "$2" "$3" "$4" ;;
destroy) [[ $# -eq 3 ]] || die "usage: $0 destroy IMAGE MOUNTPOINT"; destroy "$2" "$3" ;;
status) [[ $# -eq 2 ]] || die "usage: $0 status MOUNTPOINT"; status "$2" ;;
fstab) [[ $# -eq 3 ]] || die "usage: $0 fstab IMAGE MOUNTPOINT"; echo "$2 $3 xfs loop,nofail 0 0" ;;
*) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
