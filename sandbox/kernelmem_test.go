package sandbox

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// socketFlood opens loopback TCP connections in several processes and sends
// on each until the kernel refuses more, never reading: every byte sits in
// socket buffers, kernel memory outside the job's own pages. It then holds
// them for argv[1] seconds.
const socketFlood = `
import os, socket, sys, time
procs, per = 8, 120
deadline = time.time() + 8
for p in range(procs):
    if os.fork() == 0:
        held = []
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(per)
        buf = b"x" * 65536
        for i in range(per):
            try:
                c = socket.create_connection(ls.getsockname())
                s, _ = ls.accept()
            except OSError:
                break
            c.setblocking(False)
            held += [c, s]
            try:
                while time.time() < deadline:
                    c.send(buf)
            except OSError:
                pass
        time.sleep(float(sys.argv[1]))
        os._exit(0)
print("flooding", flush=True)
time.sleep(float(sys.argv[1]) + 8)
`

// tcpMemPages is the host's TCP memory in pages (/proc/net/sockstat "TCP:
// ... mem N"), which counts every network namespace's sockets.
func tcpMemPages(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/net/sockstat")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(fields); i++ {
			if fields[i] == "mem" {
				n, err := strconv.ParseInt(fields[i+1], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
	}
	t.Fatal("no TCP mem in /proc/net/sockstat")
	return 0
}

// TestHostileSocketBuffers: loopback socket buffers a job pins are bounded by
// its memory limit, not only its pages.
func TestHostileSocketBuffers(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	const memMB = 64
	spec := py(socketFlood)
	spec.Args = []string{"6"}
	spec.Limits.MemoryMB = memMB
	spec.Limits.TimeoutMS = 40_000
	spec.Limits.CPUMS = 30_000
	spec.Limits.Pids = 32
	base := tcpMemPages(t)
	id := job.NewID()
	var res job.Result
	var wg sync.WaitGroup
	wg.Go(func() { res = runID(t, rt, id, spec) })
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	peak := base
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
			peak = max(peak, tcpMemPages(t))
		}
	}
	grew := (peak - base) * int64(os.Getpagesize())
	t.Logf("host TCP memory grew by %d MB during the flood (status %s, peak memory %d MB)", grew>>20, res.Status, res.MemoryPeakBytes>>20)
	if grew > 2*memMB<<20 {
		t.Errorf("a %d MB job pinned %d MB of host socket memory; want under %d MB", memMB, grew>>20, 2*memMB)
	}
	healthy(t, rt)
}

// TestHostileOOMScoreAdj: the job cannot make the host's OOM killer prefer
// anything else over it.
func TestHostileOOMScoreAdj(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res := run(t, rt, py(`
import os
for v in ("0", "-1000", "500"):
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(v)
    except OSError:
        pass
try:
    init = open("/proc/1/oom_score_adj").read().strip()
except FileNotFoundError:
    init = "hidden"  # a box job sees no process but its own
print(open("/proc/self/oom_score_adj").read().strip(), init)
`))
	if underGVisor() {
		// gVisor's /proc is its own kernel's emulation (it reads 0 whatever
		// the spec says) and the host never consults it: the host's view of
		// the sandbox's processes is TestHostOOMScoreAdjOfSandbox's, which
		// holds under gVisor too. Here only: the job ran and wrote nothing
		// that failed it.
		if res.Status != job.StatusSucceeded {
			t.Fatalf("got %s %+v", res.Status, res.Error)
		}
		t.Logf("gVisor's own view: %q", res.Stdout)
	} else {
		want := "1000 1000\n"
		if testBox() {
			want = "1000 hidden\n"
		}
		requireSucceeded(t, res, want)
	}
	healthy(t, rt)
}
