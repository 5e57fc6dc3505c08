package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/sandbox/initproto"
)

// Used when the worker passes no limit: long enough never to cut a job short.
const defaultLimit = 24 * time.Hour

// exitInitFailure is kiln-init's exit code when it cannot start the launcher.
const exitInitFailure = 126

func main() {
	os.Exit(run())
}

func run() int {
	if code, ok := subcommand(os.Args); ok {
		return code
	}
	// kill(-1) below ends every process this one may signal: right for a
	// pid namespace's init, disastrous anywhere else.
	if os.Getpid() != 1 {
		return fail("must run as pid 1 of a sandbox's pid namespace")
	}
	// First, before any process of the job exists: nothing of the job may
	// read this process's memory, environment or descriptors.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail("set non-dumpable: %v", err)
	}
	nonce := os.Getenv(initproto.EnvNonce)
	statusPath := os.Getenv(initproto.EnvStatus)
	idle := envMillis(initproto.EnvIdleMS)
	timeout := envMillis(initproto.EnvTimeoutMS)
	outputsPath := os.Getenv(initproto.EnvOutputs)
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, initproto.EnvPrefix) && !strings.HasPrefix(kv, initproto.EnvReadyFD+"=") &&
			!strings.HasPrefix(kv, initproto.EnvOutputFD+"=") {
			env = append(env, kv)
		}
	}
	env = append(env, fmt.Sprintf("%s=%d", initproto.EnvReadyFD, initproto.ReadyFD))
	if len(os.Args) < 2 {
		return fail("usage: kiln-init LAUNCHER [ARGS...]")
	}

	var status *os.File
	if statusPath != "" {
		f, err := os.OpenFile(statusPath, os.O_WRONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fail("open status file: %v", err)
		}
		status = f
	}

	// Every signal: the ones to forward, SIGCHLD to reap, and the rest so a
	// signal sent by the job (kill(1, SIGSEGV)) cannot crash this process.
	sigs := make(chan os.Signal, 128)
	signal.Notify(sigs)

	readyR, readyW, err := os.Pipe()
	if err != nil {
		return fail("readiness pipe: %v", err)
	}
	files := []uintptr{0, 1, 2, readyW.Fd()}
	if outputsPath != "" {
		// The output channel: a file of the host's, appended to by the
		// launcher alone among the job's processes (it is close-on-exec
		// in the launcher), read by the worker once the job has ended.
		out, err := os.OpenFile(outputsPath, os.O_WRONLY|os.O_APPEND|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fail("open output channel: %v", err)
		}
		defer out.Close()
		files = append(files, out.Fd())
		env = append(env, fmt.Sprintf("%s=%d", initproto.EnvOutputFD, initproto.OutputFD))
	}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		return fail("launcher %s: %v", os.Args[1], err)
	}
	// The launcher gets a session (and process group) of its own, so no
	// process of the job can signal pid 1 through its group: kill(0) from
	// the group, or setpgid into pid 1's group first (a group of another
	// session cannot be joined). Ending the job is kill(-1), not a group.
	sys := &syscall.SysProcAttr{Setsid: true}
	args := os.Args[1:]
	if runAs := os.Getenv(initproto.EnvRunAs); runAs != "" && os.Getenv(initproto.EnvJobPidNS) != "" {
		// The launcher as pid 1 of a pid namespace of the job's own
		// (jobns.go), through this binary's argJob role.
		self, err := os.Executable()
		if err != nil {
			return fail("find kiln-init's own binary: %v", err)
		}
		args = append([]string{self, argJob, runAs, path}, args[1:]...)
		path = self
		sys.Cloneflags = jobCloneFlags
		// As root of the sandbox until its exec: exec keeps capabilities
		// for root alone (gVisor has no ambient set), no more than this
		// process holds (no_new_privs); argJob drops them all.
		sys.Credential = &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}}
	} else if runAs != "" {
		// The launcher and the job under another uid than this process:
		// no signal, prlimit, ptrace or scheduling call of theirs can
		// reach it, whatever pid or thread they aim at. The exec drops
		// every capability (a uid not 0, no file capabilities, no ambient
		// set, no_new_privs).
		cred, err := credential(runAs)
		if err != nil {
			return fail("%s: %v", initproto.EnvRunAs, err)
		}
		if err := keepCapabilitiesToItself(); err != nil {
			return fail("drop inheritable capabilities: %v", err)
		}
		sys.Credential = cred
	}
	pid, err := syscall.ForkExec(path, args, &syscall.ProcAttr{
		Env:   env,
		Files: files,
		Sys:   sys,
	})
	if err != nil {
		return fail("start launcher %s: %v", path, err)
	}
	readyW.Close()
	ready := make(chan bool, 1)
	go func() {
		var b [1]byte
		n, _ := readyR.Read(b[:])
		ready <- n == 1
	}()

	st := initproto.Status{Nonce: nonce}
	var readyKnown bool
	limit := time.NewTimer(cmpDuration(idle))
	launcherDone := false
	for !launcherDone {
		select {
		case r := <-ready:
			readyKnown, st.Ready = true, r
			if r {
				limit.Reset(cmpDuration(timeout))
			}
		case <-limit.C:
			st.TimedOut = true
			killAll()
		case s := <-sigs:
			switch s {
			case syscall.SIGCHLD:
				launcherDone = reap(pid, &st, unix.WNOHANG)
			case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2:
				_ = syscall.Kill(pid, s.(syscall.Signal))
			}
		}
	}
	// The launcher is gone: nothing else of the job may outlive it.
	for {
		killAll()
		var ws unix.WaitStatus
		_, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.ECHILD) {
			break
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fail("reap: %v", err)
		}
	}
	// Every writer of the readiness pipe is dead, so this cannot block.
	if !readyKnown {
		st.Ready = <-ready
	}
	if status != nil {
		b := st.Encode()
		if err := status.Truncate(0); err != nil {
			return fail("truncate status file: %v", err)
		}
		if _, err := status.WriteAt(b, 0); err != nil {
			return fail("write status file: %v", err)
		}
		if err := status.Close(); err != nil {
			return fail("close status file: %v", err)
		}
	}
	if st.Signal != 0 {
		return 128 + st.Signal
	}
	return st.ExitCode
}

// reap collects exited children; it reports whether the launcher was one of
// them and records its ending in st.
func reap(launcher int, st *initproto.Status, flags int) bool {
	done := false
	for {
		var ws unix.WaitStatus
		var ru unix.Rusage
		pid, err := unix.Wait4(-1, &ws, flags, &ru)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return done
		}
		if pid != launcher || !(ws.Exited() || ws.Signaled()) {
			continue
		}
		done = true
		if ws.Signaled() {
			st.Signal = int(ws.Signal())
		} else {
			st.ExitCode = ws.ExitStatus()
		}
		st.CPUMicros = ru.Utime.Sec*1e6 + int64(ru.Utime.Usec) + ru.Stime.Sec*1e6 + int64(ru.Stime.Usec)
	}
}

// keepCapabilitiesToItself empties this process's bounding, ambient and
// inheritable capability sets (the runtime grants them so that its exec of this
// process, as a uid other than root, keeps the permitted ones): what it
// starts then gets no capability from it at its exec.
func keepCapabilitiesToItself() error {
	// The bounding set too (CAP_SETPCAP allows it), so the job's is empty
	// as in every other sandbox; this process keeps what it holds.
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	// gVisor answers EINVAL; emptying the inheritable set below empties
	// the ambient one all the same (it is a subset of it).
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear the ambient set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// credential parses "uid:gid": the launcher's user, with no
// supplementary groups.
func credential(s string) (*syscall.Credential, error) {
	u, g, ok := strings.Cut(s, ":")
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if !ok || err1 != nil || err2 != nil || uid == 0 || gid == 0 {
		return nil, fmt.Errorf("%q is not uid:gid of a user other than root", s)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// killAll sends SIGKILL to every process in the pid namespace but this one.
func killAll() { _ = syscall.Kill(-1, syscall.SIGKILL) }

func envMillis(name string) time.Duration {
	ms, err := strconv.ParseInt(os.Getenv(name), 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

func cmpDuration(d time.Duration) time.Duration {
	if d <= 0 {
		return defaultLimit
	}
	return d
}

func fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "kiln-init: "+format+"\n", args...)
	return exitInitFailure
}
