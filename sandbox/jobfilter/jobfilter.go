package jobfilter

import (
	"encoding/binary"
	"errors"
	"runtime"

	"golang.org/x/sys/unix"
)

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const (
	bpfLdWAbs = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeqK   = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfJgeK   = 0x35 // BPF_JMP | BPF_JGE | BPF_K
	bpfJsetK  = 0x45 // BPF_JMP | BPF_JSET | BPF_K
	bpfRetK   = 0x06 // BPF_RET | BPF_K

	retAllow       = 0x7fff0000 // SECCOMP_RET_ALLOW
	retErrno       = 0x00050000 // SECCOMP_RET_ERRNO
	retKillProcess = 0x80000000 // SECCOMP_RET_KILL_PROCESS

	// struct seccomp_data offsets.
	offNr   = 0
	offArch = 4
	offArg0 = 16 // args[0], low 32 bits on a little-endian host

	x32Bit = 0x40000000 // __X32_SYSCALL_BIT
)

// nsFlags are the clone flags that make a namespace.
const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// Refused lists the syscalls a job may never make, answered EPERM.
var Refused = []uintptr{
	unix.SYS_UNSHARE, unix.SYS_SETNS,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG,
	unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_SETHOSTNAME, unix.SYS_SETDOMAINNAME, unix.SYS_SYSLOG,
	unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_QUOTACTL, unix.SYS_ACCT, unix.SYS_SWAPON, unix.SYS_SWAPOFF,
	unix.SYS_REBOOT, unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_FANOTIFY_INIT, unix.SYS_PROCESS_MADVISE, unix.SYS_PIDFD_GETFD,
}

// Missing lists the syscalls answered ENOSYS, so callers fall back to older
// ones: io_uring (its ring runs operations seccomp never sees), and clone3,
// whose flags live in memory a filter cannot read (glibc then uses clone,
// whose flags are checked).
var Missing = []uintptr{
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_CLONE3,
}

// auditArch is the AUDIT_ARCH_* of the native ABI.
var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}

type insn struct {
	code   uint16
	jt, jf uint8
	k      uint32
}

// Build returns the filter for this host's architecture.
func Build() ([]byte, error) {
	arch, ok := auditArch[runtime.GOARCH]
	if !ok {
		return nil, errors.New("jobfilter: no job filter for " + runtime.GOARCH)
	}
	eperm := retErrno | uint32(unix.EPERM)
	enosys := retErrno | uint32(unix.ENOSYS)
	var p []insn
	p = append(p,
		insn{bpfLdWAbs, 0, 0, offArch},
		insn{bpfJeqK, 1, 0, arch},
		insn{bpfRetK, 0, 0, retKillProcess},
		insn{bpfLdWAbs, 0, 0, offNr},
	)
	if runtime.GOARCH == "amd64" {
		p = append(p, insn{bpfJgeK, 0, 1, x32Bit}, insn{bpfRetK, 0, 0, enosys})
	}
	for _, nr := range Refused {
		p = append(p, insn{bpfJeqK, 0, 1, uint32(nr)}, insn{bpfRetK, 0, 0, eperm})
	}
	for _, nr := range Missing {
		p = append(p, insn{bpfJeqK, 0, 1, uint32(nr)}, insn{bpfRetK, 0, 0, enosys})
	}
	// clone: refused when its flags (args[0]) make a namespace.
	p = append(p,
		insn{bpfJeqK, 0, 3, uint32(unix.SYS_CLONE)},
		insn{bpfLdWAbs, 0, 0, offArg0},
		insn{bpfJsetK, 0, 1, nsFlags},
		insn{bpfRetK, 0, 0, eperm},
		insn{bpfRetK, 0, 0, retAllow},
	)
	out := make([]byte, 0, 8*len(p))
	for _, in := range p {
		out = binary.NativeEndian.AppendUint16(out, in.code)
		out = append(out, in.jt, in.jf)
		out = binary.NativeEndian.AppendUint32(out, in.k)
	}
	return out, nil
}
