package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"sync"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	"github.com/containerd/containerd/namespaces"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/host"
	ktrace "github.com/kilnrun/kiln/trace"
)

// A session is a box of its own whose inner sandbox is kept between calls
// (deploy/images/python/session.py): the interpreter, its variables and
// imports, its current directory and the files of /work persist. The box
// is made for the session alone, never taken from or returned to the pool,
// so no job and no other session ever runs in it; it has every guarantee of
// a job's box (its own user namespace and host uid range, the job seccomp
// filter, no capabilities, the cgroup limits).

// ErrSessionUnsupported is OpenSession's answer for a runtime whose sandbox
// cannot host sessions (no box: another isolation, or boxes turned off).
var ErrSessionUnsupported = sandboxapi.ErrSessionUnsupported

// ErrSessionGone is Exec's answer once the session's box has ended (closed,
// or ended by an anomaly): its state and files are gone with it.
var ErrSessionGone = sandboxapi.ErrSessionGone

// What a session's box is made for, what a call did to its interpreter, a
// file of its /work (sandboxapi).
type (
	SessionOptions = sandboxapi.SessionOptions
	CallInfo       = sandboxapi.CallInfo
	SessionFile    = sandboxapi.SessionFile
)

// Session is a session's box. Its calls run one at a time (Exec holds a
// lock). Close removes the box.
type Session struct {
	r       *Containerd
	sb      *sandbox
	img     *imageEntry
	runtime string
	work    *jobWork
	mem     int64

	mu     sync.Mutex
	gone   bool
	closed sync.Once
	// egress is the listener of the session's proxy in the interpreter's
	// network namespace (a session with a network), lent to each call.
	egress sessionEgress
}

// HostsSessions is true: OpenSession makes a session's box for a runtime
// whose sandbox is a box (and refuses the others with
// ErrSessionUnsupported).
func (r *Containerd) HostsSessions() bool { return true }

// OpenSession makes a box for a session of o.Runtime and its work dir. The
// interpreter starts with the first call.
func (r *Containerd) OpenSession(ctx context.Context, o SessionOptions) (sandboxapi.Session, error) {
	s, err := r.openSession(ctx, o)
	if err != nil {
		return nil, err // not a nil *Session in an interface
	}
	return s, nil
}

func (r *Containerd) openSession(ctx context.Context, o SessionOptions) (*Session, error) {
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	if err := job.ValidateRuntime(o.Runtime, r.Runtimes()); err != nil {
		return nil, err
	}
	img, err := r.images.resolve(ctx, o.Runtime)
	if err != nil {
		return nil, err
	}
	lim, err := r.cfg.Policy.Resolve(job.Limits{MemoryMB: o.MemoryMB})
	if err != nil {
		return nil, err
	}
	key, ok := r.box.boxCfg.boxable(o.Runtime, img, lim, o.Tenant, boxSession)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrSessionUnsupported, o.Runtime)
	}
	// A spare box made ahead of demand when there is one (labelled now),
	// else one made now (lean for a session brought back: its memory is
	// gone, so preloading would only delay its calls); either way the next
	// spare is made behind it.
	sb := r.box.takeSpare(ctx, o.Runtime, key.Class)
	if sb != nil && o.ID != "" {
		if _, err := sb.container.SetLabels(ctx, map[string]string{ctrd.LabelSession: o.ID}); err != nil {
			r.box.removeSessionBox(ctx, sb)
			sb = nil
		}
	}
	if sb == nil {
		if sb, err = r.box.prepareBox(ctx, key.Class, img, boxFor{session: o.ID, lean: o.Restore}); err != nil {
			r.box.removeSessionBox(ctx, sb)
			return nil, fmt.Errorf("sandbox: session box: %w", err)
		}
	}
	r.box.growSpare(ctx, o.Runtime, img, key.Class)
	sb.box.tenant, sb.box.session = o.Tenant, true
	jw, err := newJobWork(sb)
	if err != nil {
		r.box.removeSessionBox(ctx, sb)
		return nil, err
	}
	return &Session{r: r, sb: sb, img: img, runtime: o.Runtime, work: jw, mem: lim.MemoryMB}, nil
}

// removeSessionBox stops and removes a session's box (never a pool's:
// the pool's accounting does not count it).
func (b *boxClient) removeSessionBox(ctx context.Context, sb *sandbox) {
	if sb == nil {
		return
	}
	b.ct.retire(context.WithoutCancel(ctx), sb) // its undo stack closes the control socket
}

// ContainerID names the session's box in containerd.
func (s *Session) ContainerID() string { return s.sb.id }

// Image is the image the session runs.
func (s *Session) Image() job.Image { return job.Image{Name: s.img.ref, Digest: s.img.digest.String()} }

// MemoryMB is the session's memory cap.
func (s *Session) MemoryMB() int64 { return s.mem }

// Alive reports whether the session's box still serves calls.
func (s *Session) Alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.gone && !s.sb.exited
}

// Close removes the session's box, its interpreter and its files. Calling
// it again is harmless.
func (s *Session) Close(ctx context.Context) {
	s.closed.Do(func() {
		s.mu.Lock()
		s.gone = true
		s.mu.Unlock()
		s.egress.drop()
		s.r.box.removeSessionBox(namespaces.WithNamespace(ctx, s.r.cfg.Namespace), s.sb)
	})
}

// Exec runs one call in the session: req.Spec's code in the session's
// interpreter, its files written to /work first, its output to req.Output,
// its display values too large to carry inline to req.Store, its network
// (the session's, if it has one) served by req.Network. req.Tenant is not
// read: the box is the session's tenant's. The call's limits hold the
// call alone (its wall clock, its CPU over all its processes, its output):
// at one, the call is interrupted and the interpreter kept when it yields;
// the session's memory cap holds every call together. An error means the
// call did not run (the box is gone, or the spec is not valid: the result
// then says so).
func (s *Session) Exec(ctx context.Context, req Request) (job.Result, CallInfo, error) {
	id, spec := req.ID, req.Spec
	s.mu.Lock()
	defer s.mu.Unlock()
	r, sb := s.r, s.sb
	res := job.Result{ID: id, Image: s.Image()}
	var info CallInfo
	if s.gone || sb.exited {
		return res, info, ErrSessionGone
	}
	spec.Runtime = s.runtime
	spec.Normalize()
	network := !spec.Network.Empty()
	lim, frame, err := r.check(id, spec)
	if err == nil && network {
		if !req.Net().Enabled() || s.img.isolation != IsolationRunc {
			err = fmt.Errorf("%w (isolation %s)", errNoEgress, s.img.isolation)
		} else {
			spec.Env = withEgressEnv(spec.Env)
			frame, err = encodeFrame(spec)
		}
	}
	if err != nil {
		res.Status = job.StatusFailed
		res.Error = job.NewFailure(job.CategoryInvalidRequest, err.Error())
		return res, info, fmt.Errorf("sandbox: session call %s: %w", id, err)
	}
	req.Spec = spec
	lim.MemoryMB = s.mem
	res.Limits = &lim
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(ktrace.SandboxBoxKey.Bool(true), ktrace.ContainerImageNameKey.String(s.img.ref),
		ktrace.OCIManifestDigestKey.String(s.img.digest.String()), ktrace.ContainerIDKey.String(sb.id))
	if err := r.exec.arm(ctx, sb, req, lim); err != nil {
		return res, info, fmt.Errorf("sandbox: session box %s: %w", sb.id, err)
	}
	sb.box.jobDir = s.work.dir
	defer func() { sb.box.jobDir = "" }()
	r.box.running.Store(id, sb)
	defer r.box.running.Delete(id)
	p := boxParams{UID: s.work.uid, Work: s.work.name, FSize: lim.DiskMB << 20, NoFile: ctrd.OpenFilesLimit,
		TmpMB: lim.DiskMB, RMem: "4096 131072 " + ctrd.SocketBufferMax, WMem: "4096 16384 " + ctrd.SocketBufferMax, Session: true}
	t, err := newBoxTarget(r.box, sb, p, frame, req, nil, artifactsOfCall)
	if err != nil {
		return res, info, err
	}
	defer t.close()
	t.listenFn = func(ctx context.Context) (net.Listener, error) { return s.egress.forCall(ctx, t.egress) }
	result, err := r.exec.execute(ctx, t, req, lim, res, r.exec.endingFor(ctx, s.runtime, s.img, lim))
	if err == nil && t.undelivered != nil {
		// The session's zygote had ended before the call reached it: the
		// call never ran.
		err = fmt.Errorf("the call was not delivered: %w%s", t.undelivered, launcherFault(sb))
	}
	if err != nil {
		s.gone = true
		return res, info, fmt.Errorf("%w: %w", ErrSessionGone, err)
	}
	rep := t.rep
	if rep.Ended || !rep.Clean {
		s.egress.drop() // the interpreter's network namespace is gone
	}
	info = CallInfo{Fresh: rep.Fresh, Ended: rep.Ended}
	if !rep.Clean {
		// The interpreter, the zygote or the box ended (a report the
		// zygote never sent is not clean): the session's box is gone.
		s.gone = true
		info.Ended = true
	}
	sb.box.jobs++
	sb.box.lastUsed = r.box.boxCfg.Now() // the clock boxes are judged by, as a job's box (runBox)
	return result, info, nil
}

// WalkFiles calls fn with every regular file of the session's /work (never
// following a symlink the session planted: the walk is confined to the
// work dir with os.Root, and only regular files are reported). Call it
// between calls.
func (s *Session) WalkFiles(fn func(f SessionFile, open func() (*os.File, error)) error) error {
	root, err := os.OpenRoot(s.work.dir)
	if err != nil {
		return fmt.Errorf("sandbox: session files: %w", err)
	}
	defer root.Close()
	return fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return fn(SessionFile{Name: name, Size: info.Size(), Mode: info.Mode().Perm()},
			func() (*os.File, error) { return root.OpenFile(name, os.O_RDONLY|noFollow, 0) })
	})
}

// noFollow keeps the last element of a path from being a symlink.
const noFollow = unix.O_NOFOLLOW

// PutFile writes a file into the session's /work (restoring a checkpoint),
// owned by the session's uid, without following a symlink.
func (s *Session) PutFile(name string, data []byte, mode fs.FileMode) error {
	if !fs.ValidPath(name) || name == "." {
		return fmt.Errorf("sandbox: session file %q is not a relative path", name)
	}
	root, err := os.OpenRoot(s.work.dir)
	if err != nil {
		return fmt.Errorf("sandbox: session files: %w", err)
	}
	defer root.Close()
	host := s.sb.box.base + s.work.uid
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("sandbox: session file %s: %w", name, err)
		}
		for d := dir; d != "."; d = path.Dir(d) {
			if err := root.Lchown(d, host, host); err != nil {
				return fmt.Errorf("sandbox: session file %s: %w", name, err)
			}
		}
	}
	_ = root.Remove(name)
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, mode.Perm()|0o600)
	if err != nil {
		return fmt.Errorf("sandbox: session file %s: %w", name, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("sandbox: session file %s: %w", name, err)
	}
	if err := f.Chown(host, host); err != nil {
		f.Close()
		return fmt.Errorf("sandbox: session file %s: %w", name, err)
	}
	return f.Close()
}

// MemoryInUse is the memory charged to the session's box now (its cgroup:
// the zygote, the interpreter and what it holds, kiln-init); 0 when it
// cannot be read.
func (s *Session) MemoryInUse() int64 {
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), s.sb.cgroupsPath)
	if err != nil {
		return 0
	}
	n, err := cg.MemoryUsage()
	if err != nil || n < 0 {
		return 0
	}
	return n
}
