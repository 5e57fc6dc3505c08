package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SetCPULimit sets RLIMIT_CPU of host process pid, which runs as uid, to
// soft seconds (hard: one more). With CAP_SYS_RESOURCE the worker does it
// itself; a host that withholds that capability from root (some VMs and
// nested containers do) lets only the process's own user change its limits,
// so util-linux's prlimit then does it as uid.
func SetCPULimit(ctx context.Context, pid, uid int, soft uint64) error {
	rl := unix.Rlimit{Cur: soft, Max: soft + 1}
	err := unix.Prlimit(pid, unix.RLIMIT_CPU, &rl, nil)
	if err == nil || !errors.Is(err, unix.EPERM) || uid == 0 {
		if err != nil {
			return fmt.Errorf("set RLIMIT_CPU of %d: %w", pid, err)
		}
		return nil
	}
	cmd := exec.CommandContext(ctx, prlimitCommand, "--pid", strconv.Itoa(pid), fmt.Sprintf("--cpu=%d:%d", soft, soft+1))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("set RLIMIT_CPU of %d as uid %d with %s: %w: %s", pid, uid, prlimitCommand, err, bytes.TrimSpace(out))
	}
	return nil
}

// prlimitCommand is util-linux's prlimit (Debian's essential util-linux).
const prlimitCommand = "prlimit"

// ProcessCPU is a host process's user+system CPU time so far, from
// /proc/<pid>/stat (clock ticks of 1/100 s, USER_HZ on every Linux ABI).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	// The command name is in parentheses and may hold spaces: fields
	// count from after its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat of %d: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat of %d: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat of %d: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
