#!/usr/bin/env python3
"""Runs a command with io_uring refused, as a container runtime's seccomp
profile (or `sysctl kernel.io_uring_disabled=2`) refuses it: io_uring_setup
fails with EPERM. x86_64 and aarch64 only.

Usage: book/tools/no-io-uring.py COMMAND [ARGS...]
"""
import ctypes
import os
import platform
import struct
import sys

IO_URING_SETUP = 425  # same number on x86_64 and aarch64
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
EPERM = 1
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06


def insn(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    arch = AUDIT_ARCH.get(platform.machine())
    if arch is None:
        sys.exit(f"unsupported machine {platform.machine()}")
    prog = b"".join([
        insn(BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        insn(BPF_JEQ_K, 1, 0, arch),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        insn(BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        insn(BPF_JEQ_K, 0, 1, IO_URING_SETUP),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ])
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HxxxxxxQ", len(prog) // 8, ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fbuf), 0, 0) != 0:
        sys.exit(f"prctl(SECCOMP): {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
