package sandbox

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// userLimitsProbe exhausts (argv[1] == "hog") or samples (argv[1] ==
// "probe") the kernel's per-user resources: inotify instances
// (fs.inotify.max_user_instances), pipe buffer pages (fs.pipe-user-pages-soft:
// past it F_SETPIPE_SZ is refused) and POSIX mqueue bytes (RLIMIT_MSGQUEUE).
const userLimitsProbe = `
import ctypes, fcntl, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
class MqAttr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(MqAttr)]
F_SETPIPE_SZ = 1031
def inotify():
    fd = libc.inotify_init()
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init")
    return fd
def big_pipe():
    r, w = os.pipe()
    os.close(r)
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
    except OSError:
        os.close(w)
        raise
    return w
def mqueue(i):
    a = MqAttr(0, 10, 8192, 0)
    fd = libc.mq_open(b"/kiln%d" % i, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "mq_open")
    return fd
out = {"uid": os.getuid()}
hog = sys.argv[1] == "hog"
for name, make, most in (("inotify", lambda i: inotify(), 160), ("pipe", lambda i: big_pipe(), 80), ("mqueue", mqueue, 16)):
    n, err = 0, ""
    for i in range(most if hog else 1):
        try:
            make(i); n += 1
        except OSError as e:
            err = os.strerror(e.errno); break
    out[name] = n
    out[name + "_error"] = err
print(json.dumps(out), flush=True)
if hog:
    time.sleep(float(sys.argv[2]))
`

type userLimits struct {
	UID        int    `json:"uid"`
	Inotify    int    `json:"inotify"`
	InotifyErr string `json:"inotify_error"`
	Pipe       int    `json:"pipe"`
	PipeErr    string `json:"pipe_error"`
	Mqueue     int    `json:"mqueue"`
	MqueueErr  string `json:"mqueue_error"`
}

// TestPerJobUserLimits: two live sandboxes run as different host uids, so a
// job that uses up its per-user kernel limits leaves the other job's intact.
func TestPerJobUserLimits(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	hog := py(userLimitsProbe)
	hog.Args = []string{"hog", "8"}
	hog.Limits.TimeoutMS = 30_000
	// The hog uses its limits up, prints what it got, then holds them for 8 s.
	holding := make(chan struct{})
	var once sync.Once
	base := Request{Output: func(stream string, p []byte) {
		if stream == "stdout" && strings.Contains(string(p), `"uid"`) {
			once.Do(func() { close(holding) })
		}
	}}
	ctx := t.Context()
	var hogRes job.Result
	var wg sync.WaitGroup
	wg.Go(func() {
		var err error
		if hogRes, err = rt.Run(ctx, asRun(base, job.NewID(), hog)); err != nil {
			t.Errorf("Run: %v (result %+v)", err, hogRes)
		}
	})
	testkit.Closed(t, holding, time.Minute, "the hog to hold its limits")
	probe := py(userLimitsProbe)
	probe.Args = []string{"probe"}
	res := run(t, rt, probe)
	wg.Wait()
	var h, p userLimits
	for _, x := range []struct {
		res job.Result
		dst *userLimits
	}{{hogRes, &h}, {res, &p}} {
		if x.res.Status != job.StatusSucceeded {
			t.Fatalf("%s %+v\n%s", x.res.Status, x.res.Error, x.res.Stderr)
		}
		if err := json.Unmarshal([]byte(strings.TrimSpace(x.res.Stdout)), x.dst); err != nil {
			t.Fatalf("%q: %v", x.res.Stdout, err)
		}
	}
	t.Logf("hog %+v; probe %+v", h, p)
	if h.UID == p.UID {
		t.Errorf("both live sandboxes ran as host uid %d", h.UID)
	}
	// Under gVisor each sandbox has a kernel of its own: the host's per-user
	// limits are not reached through it (the hog's inotify instances, pipes
	// and queues are the sentry's memory, bounded by the job's memory limit),
	// and the other job's are untouched, which is what is checked next.
	if !underGVisor() && (h.InotifyErr == "" || h.PipeErr == "" || h.MqueueErr == "") {
		t.Errorf("the hog did not reach every per-user limit: %+v", h)
	}
	if p.Inotify != 1 || p.Pipe != 1 || p.Mqueue != 1 {
		t.Errorf("the other job was refused what its own limits allow: %+v", p)
	}
	healthy(t, rt)
}

func runID(t testing.TB, rt *Containerd, id string, spec job.Spec) job.Result {
	t.Helper()
	res, err := rt.Run(t.Context(), Request{ID: id, Spec: spec})
	if err != nil {
		t.Errorf("Run: %v (result %+v)", err, res)
	}
	return res
}
