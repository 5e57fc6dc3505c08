package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
)

// A job with a network reaches the outside only through its egress proxy,
// served by the worker (the run's Network) on a listener that lives in the job's
// own loopback-only network namespace: the job connects to
// 127.0.0.1:egressPort, and the worker accepts. Nothing else of the job's
// namespace changes: no interface, no route, no DNS.
//
// In a box, the job's namespace is made per job by the zygote: its first
// child makes the listener there and hands it over a socket pair the worker
// gave with the job (box.py). In a container of its own, the worker makes
// the listener itself, from a thread that enters the container's network
// namespace for the call.

// egressPort is the job's proxy port on its own loopback.
const egressPort = 3128

// egressProxyURL is what the job's HTTP clients are pointed at.
var egressProxyURL = "http://127.0.0.1:" + strconv.Itoa(egressPort)

// errNoEgress refuses a job with a network on a worker (or an isolation)
// that cannot give it one.
var errNoEgress = errors.New("this worker cannot give a job network access")

// withEgressEnv points the job's HTTP clients at its proxy: Python's
// urllib and requests read the *_PROXY variables; the node launcher reads
// KILN_EGRESS_PROXY.
func withEgressEnv(env map[string]string) map[string]string {
	out := make(map[string]string, len(env)+7)
	for k, v := range env {
		out[k] = v
	}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "KILN_EGRESS_PROXY"} {
		out[k] = egressProxyURL
	}
	delete(out, "NO_PROXY")
	delete(out, "no_proxy")
	return out
}

// egressRun is one job's proxy while the job runs.
type egressRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	acct   *job.Egress
	err    error
}

// serveEgress serves the listener that listen returns (it may block until
// the job's namespace exists) with n until finish.
func serveEgress(ctx context.Context, n Network, listen func(context.Context) (net.Listener, error)) *egressRun {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e := &egressRun{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		ln, err := listen(ctx)
		if err != nil {
			e.err = err
			e.acct = &job.Egress{}
			return
		}
		e.acct = n.Serve(ctx, ln)
		ln.Close()
	}()
	return e
}

// finish ends the proxy (cutting every connection still open: nothing of
// the job outlives it) and returns the job's account.
func (e *egressRun) finish() (*job.Egress, error) {
	if e == nil {
		return nil, nil
	}
	e.cancel()
	<-e.done
	return e.acct, e.err
}

// egressPair is the socket pair the zygote hands the job's listener back
// on: the worker's end, and the end sent with the job.
func egressPair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: egress socket pair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "egress-worker")
	defer ours.Close()
	c, err := net.FileConn(ours)
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("sandbox: egress socket pair: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "egress-zygote"), nil
}

// receiveListener reads the job's listener from the zygote's side of the
// pair: one byte with one descriptor. It fails when the pair closes first
// (the job's sandbox could not be made; the zygote reports why).
func receiveListener(ctx context.Context, c *net.UnixConn) (net.Listener, error) {
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	b, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("sandbox: egress: no listener from the box: %w", errors.Join(err, errors.New("closed")))
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("sandbox: egress: the box sent no listener: %w", errors.Join(err, errors.New("no descriptor")))
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("sandbox: egress: the box sent no listener: %w", errors.Join(err, errors.New("not one descriptor")))
	}
	return fileListener(fds[0])
}

// fileListener makes fd, a listening TCP socket, a net.Listener (which
// holds a copy of fd), and closes fd.
func fileListener(fd int) (net.Listener, error) {
	f := os.NewFile(uintptr(fd), "egress-listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("sandbox: egress: listener: %w", err)
	}
	return ln, nil
}

// listenInNetns listens on the proxy address in the network namespace of
// process pid (a container's init). The thread that enters the namespace is
// locked to its goroutine; if it cannot return to the worker's own
// namespace it is never unlocked, so the runtime discards it.
func listenInNetns(pid uint32) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("sandbox: egress: own network namespace: %w", err)}
			return
		}
		defer self.Close()
		target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("sandbox: egress: the sandbox's network namespace: %w", err)}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("sandbox: egress: enter the sandbox's network namespace: %w", err)}
			return
		}
		fd, lerr := listenFD()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			if fd >= 0 {
				unix.Close(fd)
			}
			ch <- result{err: fmt.Errorf("sandbox: egress: return to the worker's network namespace: %w", err)}
			return // the thread stays locked: it is discarded
		}
		runtime.UnlockOSThread()
		if lerr != nil {
			ch <- result{err: lerr}
			return
		}
		ln, err := fileListener(fd)
		ch <- result{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

// listenFD makes the proxy's listening socket with raw system calls, all
// on the calling thread (so in its network namespace).
func listenFD() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("sandbox: egress: socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: egressPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sandbox: egress: bind 127.0.0.1:%d in the sandbox: %w", egressPort, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sandbox: egress: listen: %w", err)
	}
	return fd, nil
}

// sessionEgress holds a session's proxy listener: made in the interpreter's
// network namespace by the call that starts the interpreter, kept while the
// interpreter lives, and lent to each call's proxy in turn (so each call's
// result accounts for its own connections). Between calls nobody accepts:
// a connection made then waits for the next call.
type sessionEgress struct {
	mu sync.Mutex
	ln *net.TCPListener
}

// forCall returns the listener for this call: the one the zygote sends on c
// when the call starts a new interpreter (replacing the last, whose
// namespace is gone), else the interpreter's.
func (se *sessionEgress) forCall(ctx context.Context, c *net.UnixConn) (net.Listener, error) {
	ln, err := receiveListener(ctx, c)
	se.mu.Lock()
	defer se.mu.Unlock()
	if err == nil {
		tcp, ok := ln.(*net.TCPListener)
		if !ok {
			ln.Close()
			return nil, fmt.Errorf("sandbox: egress: the box sent a %T, not a TCP listener", ln)
		}
		if se.ln != nil {
			se.ln.Close()
		}
		se.ln = tcp
	}
	if se.ln == nil {
		return nil, fmt.Errorf("sandbox: egress: the session has no proxy listener: %w", err)
	}
	if err := se.ln.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("sandbox: egress: %w", err)
	}
	return &lentListener{TCPListener: se.ln, closed: make(chan struct{})}, nil
}

// drop closes the listener (the interpreter, or the session, ended).
func (se *sessionEgress) drop() {
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.ln != nil {
		se.ln.Close()
		se.ln = nil
	}
}

// lentListener is a session's listener lent to one call's proxy: closing it
// ends that proxy's Accept and leaves the listener open for the next call.
type lentListener struct {
	*net.TCPListener
	once   sync.Once
	closed chan struct{}
}

func (l *lentListener) Accept() (net.Conn, error) {
	c, err := l.TCPListener.Accept()
	if err != nil {
		select {
		case <-l.closed:
			return nil, net.ErrClosed
		default:
		}
	}
	return c, err
}

func (l *lentListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		_ = l.TCPListener.SetDeadline(time.Unix(1, 0))
	})
	return nil
}
