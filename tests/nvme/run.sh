#!/usr/bin/env bash
# tests/nvme/run.sh - NVMe passthrough for real: builds examples/nvme_check
# and runs it inside a small VM with an emulated NVMe controller
# (../shared/tools/nvme-vm/run-in-nvme-vm.sh) for each configuration below.
#
# Configurations: 512-byte LBAs (default MDTS 512 KiB, with a QD-32 passthrough
# vs block-device read comparison); 4096-byte LBAs on two namespaces with
# MDTS 256 KiB (1 MiB IOs split into 4 commands); --iopoll on a controller
# with a poll queue (nvme.poll_queues=1) on the default Linux 6.1 guest, where
# plugio must stay interrupt-driven (6.1's polled passthrough faults); and,
# when the newer Debian cloud kernel can be fetched from bookworm-backports
# (the apt lists install-deps.sh sets up), IOPOLL and registered buffers for
# real on it (otherwise that configuration is SKIPPED with a message).
#
# A host without the VM tools, or where the VM cannot boot, SKIPS with a
# message on stderr and exit 0; set NVME_REQUIRED=1 to make that exit 1.
# Environment: NVME_BENCH_OPS (default 3000), CARGO_TARGET_DIR, PLUGIO_SHARED
# (default: ../shared next to the repository root), plus the VM script's own
# knobs (TIMEOUT, VERBOSE, ACCEL...).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${PLUGIO_SHARED:-$(cd "$ROOT/.." && pwd)/shared}
VM=$SHARED/tools/nvme-vm/run-in-nvme-vm.sh
BENCH_OPS=${NVME_BENCH_OPS:-3000}

skip() {
  echo "=== NVMe passthrough VM tests SKIPPED: $*" >&2
  [ "${NVME_REQUIRED:-0}" = 1 ] && exit 1
  exit 0
}

[ -x "$VM" ] || skip "no $VM (the shared tools are expected at ../shared from the repository root)"
for t in qemu-system-x86_64 qemu-img cpio; do
  command -v "$t" >/dev/null || skip "$t missing (run $SHARED/tools/nvme-vm/install-deps.sh)"
done
if [ ! -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then
  skip "static busybox missing (run $SHARED/tools/nvme-vm/install-deps.sh)"
fi

cd "$ROOT"
cargo build --release --example nvme_check
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/nvme_check
[ -x "$BIN" ] || { echo "nvme_check was not built at $BIN" >&2; exit 1; }

# Does the VM boot here at all (kernel download, TCG/KVM)?
set +e
TIMEOUT=${TIMEOUT:-300} "$VM" /bin/true
rc=$?
set -e
case $rc in
  0) ;;
  124) skip "the VM did not finish booting in time (no working KVM/TCG?)" ;;
  *) skip "the VM harness failed to boot (exit $rc); see its message above" ;;
esac

failed=()
run_cfg() {  # name, env assignments..., --, nvme_check args...
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  echo "=== nvme config $name: ${envs[*]} nvme_check $*"
  local t0=$SECONDS
  if env NVME_IMG_SIZE=512M "${envs[@]}" "$VM" "$BIN" "$@"; then
    echo "=== nvme config $name passed ($((SECONDS - t0)) s)"
  else
    echo "=== nvme config $name FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
}

run_cfg lba512 NVME_LBA=512 -- --lba 512 --mdts-kb 512 --bench "$BENCH_OPS"
run_cfg lba4096-2ns-mdts256 NVME_LBA=4096 NVME_NS=2 "QEMU_EXTRA=-global nvme.mdts=6" \
  -- --lba 4096 --mdts-kb 256
run_cfg linux61-iopoll-stays-irq NVME_LBA=512 "KAPPEND=quiet loglevel=1 nvme.poll_queues=1" \
  -- --lba 512 --iopoll --bench "$BENCH_OPS"

# `plugio bench` on the passthrough namespace and on its block device, side
# by side (absolute speed under TCG means little; both must complete). One
# vCPU: qemu's TCG has aborted (iotlb_to_section) on this large binary
# with two. A harness failure is retried once.
cargo build --release --bin plugio
PLUGIO=${CARGO_TARGET_DIR:-$ROOT/target}/release/plugio
BENCH_SH=$(mktemp)
printf '#!/bin/sh\nset -e\n%s bench --filename /dev/ng0n1 --runtime 2 --iodepth 32 --size 32M\n%s bench --filename /dev/nvme0n1 --runtime 2 --iodepth 32 --size 32M\n' \
  "$PLUGIO" "$PLUGIO" > "$BENCH_SH"
chmod +x "$BENCH_SH"
bench_in_vm() {
  env NVME_IMG_SIZE=64M NVME_LBA=512 SMP=1 "$VM" -f "$PLUGIO" -f "$BENCH_SH" -- /bin/sh "$BENCH_SH"
}
echo "=== nvme config plugio-bench: plugio bench on /dev/ng0n1 and /dev/nvme0n1"
if bench_in_vm || bench_in_vm; then
  echo "=== nvme config plugio-bench passed"
else
  echo "=== nvme config plugio-bench FAILED"
  failed+=(plugio-bench)
fi
rm -f "$BENCH_SH"

# The newest cloud kernel in backports (Linux 6.5+ has safe polled
# passthrough), cached beside the default one.
newer_kernel_cache() {
  local cache=${TMPDIR:-/tmp}/nvmevm/cache-newer apt_dir=${TMPDIR:-/tmp}/nvmevm/apt
  if ls "$cache"/kroot/boot/vmlinuz-* >/dev/null 2>&1; then echo "$cache"; return 0; fi
  [ -d "$apt_dir/parts" ] || return 1
  local O=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
           -o "Dir::State::Lists=$apt_dir/lists")
  local pkg
  pkg=$(apt-cache "${O[@]}" show linux-image-cloud-amd64 2>/dev/null \
        | awk '/^Depends: linux-image-[0-9]/{print $2}' | sort -V | tail -1)
  case "$pkg" in linux-image-6.[5-9]*|linux-image-6.[1-9][0-9]*|linux-image-[7-9].*) ;; *) return 1 ;; esac
  mkdir -p "$cache/debs"
  (cd "$cache/debs" && apt-get "${O[@]}" download "$pkg" >/dev/null 2>&1) || return 1
  rm -rf "$cache/kroot.tmp"
  dpkg -x "$(ls "$cache"/debs/"$pkg"_*.deb | head -1)" "$cache/kroot.tmp" || return 1
  mv "$cache/kroot.tmp" "$cache/kroot"
  echo "$cache"
}
if NEWER=$(newer_kernel_cache); then
  run_cfg newer-kernel-iopoll "NVMEVM_CACHE=$NEWER" NVME_LBA=512 \
    "KAPPEND=quiet loglevel=1 nvme.poll_queues=1" -- --lba 512 --iopoll --bench "$BENCH_OPS"
else
  echo "=== nvme config newer-kernel-iopoll SKIPPED: no Linux 6.5+ cloud kernel from bookworm-backports" \
       "(run $SHARED/tools/nvme-vm/install-deps.sh on a host that needs its packages, or put a kernel" \
       "tree in ${TMPDIR:-/tmp}/nvmevm/cache-newer/kroot)" >&2
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "=== NVMe passthrough VM tests FAILED: ${failed[*]}"
  exit 1
fi
echo "=== NVMe passthrough VM tests passed"

