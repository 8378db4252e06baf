#!/bin/busybox sh
# Test host stage 1 (initramfs /init): load the virtio block driver, mount the root disk and switch to it.
# The root is a real ext4 disk rather than the initramfs so that pivot_root works for containers inside.
/bin/busybox mkdir -p /proc /sys /dev /newroot
/bin/busybox mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
/bin/busybox mount -t proc proc /proc
echo "cube-testhost: stage1 at $(/bin/busybox cut -d' ' -f1 /proc/uptime)s"
for m in $(/bin/busybox cat /modules.order); do
	/bin/busybox insmod "/modules/$m" || echo "cube-testhost: insmod $m failed"
done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do /bin/busybox usleep 50000; i=$((i+1)); done
if ! /bin/busybox mount -t ext4 /dev/vda /newroot; then
	echo "cube-testhost: cannot mount the root disk /dev/vda"
	/bin/busybox poweroff -f
fi
/bin/busybox umount /proc
/bin/busybox mount --move /dev /newroot/dev
exec /bin/busybox switch_root /newroot /cube/stage2
