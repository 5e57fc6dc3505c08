package chaos

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
	"github.com/kilnrun/kiln/worker"
)

// smallFS mounts a tmpfs of size bytes for the test (unmounted after it):
// a disk the test can fill.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		testenv.Unavailable(t, "mount a tmpfs of %s (needs root): %v", size, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fill writes a ballast file into dir until at most leave bytes are free.
func fill(t *testing.T, dir string, leave int64) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ballast")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for left := int64(st.Bavail)*st.Bsize - leave; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
			t.Fatalf("ballast: %v", err)
		}
	}
	return path
}

// Issue 40, acceptance 6: JetStream's disk fills while jobs that spill
// their output (1 MiB of stdout, past the 64 KiB kept inline) run. JetStream
// latches the object store stream's write error and answers its writes no
// more; each of 20 jobs then ends failed, output_limit, not retryable, on
// attempt 1, run once, its stdout kept inline up to 64 KiB and the message
// naming the object store. The API's /readyz is unready within 5 s of the
// first refused write (the worker's at once). Freeing the space is not
// enough: the stream refuses writes until the NATS server restarts; after
// the restart /readyz recovers and a job spills its output again.
func TestObjectStoreDiskFullFailsEachJobOnce(t *testing.T) {
	fs := smallFS(t, "64m")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := testenv.StartRedis(t)
	n := testenv.StartNATSIn(t, filepath.Join(fs, "nats"))
	st, err := cache.New(ctx, cache.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	nc, err := nats.Connect(n.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	srv, err := producer.New(ctx, producer.Config{Store: st, NATS: nc, Queue: outageQueue, Policy: job.DefaultPolicy(),
		RuntimeCacheTTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(srv.StopLongPolls)
	api, err := client.New(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	var runsMu sync.Mutex
	runs := map[string]int{}
	rt := &testkit.Runtime{Script: func(ctx context.Context, id string, spec job.Spec) (job.Result, error) {
		runsMu.Lock()
		runs[id]++
		runsMu.Unlock()
		res := job.Result{Status: job.StatusSucceeded, ExitCode: job.IntPtr(0), Image: testkit.ScriptedImage}
		out := []byte(strings.Repeat(id[len(id)-8:], (1<<20)/8)) // each job's own, so none is stored already
		res.SetOutput(out, nil)
		res.StdoutBytes = int64(len(out))
		return res, nil
	}}
	w, err := worker.New(worker.Config{ID: "w-diskfull", Runtime: rt, Store: st, NATS: nc, Concurrency: 2,
		Queue: outageQueue, Heartbeat: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopWorker := testkit.Start(t, "worker.Run", w.Run)
	defer stopWorker()
	ready := func() bool {
		resp, err := http.Get(hs.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	testkit.Eventually(t, 30*time.Second, "the API and the worker ready", func() bool {
		ok, _ := w.Readiness(ctx)
		return ok && ready()
	})

	// The API's /readyz, watched from now on: when it first fails.
	var unreadyAt atomic.Int64
	watch, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-watch.Done():
				return
			case <-tick.C:
			}
			if !ready() {
				unreadyAt.CompareAndSwap(0, time.Now().UnixNano())
			}
		}
	}()

	ballast := fill(t, fs, 512<<10) // less than one job's output
	const jobs = 20
	ids := make([]string, jobs)
	for i := range ids {
		sub, err := api.Submit(ctx, job.Spec{Runtime: "python", Code: "print(" + strings.Repeat("1", i+1) + ")", Cache: job.CacheOff()})
		if err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
		ids[i] = sub.ID
	}
	var firstRefused time.Time
	failed := 0
	for i, id := range ids {
		v, err := api.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
		runsMu.Lock()
		ran := runs[id]
		runsMu.Unlock()
		if ran != 1 || v.Attempt != 1 {
			t.Errorf("job %d: ran %d times, attempt %d; want once, attempt 1", i, ran, v.Attempt)
		}
		failed++
		if v.Status != job.StatusFailed || v.Error == nil || v.Error.Category != job.CategoryOutputLimit || v.Error.Retryable ||
			!strings.Contains(v.Error.Message, "object store does not take writes") || !v.StdoutTruncated || len(v.Stdout) != job.MaxInlineOutputBytes {
			t.Errorf("job %d: %s %+v, stdout %d bytes (truncated %v); want failed, output_limit, not retryable, naming the object store, 64 KiB kept",
				i, v.Status, v.Error, len(v.Stdout), v.StdoutTruncated)
			continue
		}
		if firstRefused.IsZero() || v.FinishedAt.Before(firstRefused) {
			firstRefused = *v.FinishedAt // the write was refused after this moment
		}
	}
	if failed != jobs {
		t.Fatalf("%d of %d jobs failed for want of room", failed, jobs)
	}
	if ok, checks := w.Readiness(ctx); ok || !strings.HasPrefix(checks["object_store"], "unavailable") {
		t.Errorf("the worker's readiness: %v %v; want object_store unavailable", ok, checks)
	}
	at := unreadyAt.Load()
	if at == 0 {
		t.Fatal("the API's /readyz never failed")
	}
	after := time.Unix(0, at).Sub(firstRefused)
	t.Logf("%d of %d jobs failed once as output_limit; the API's /readyz failed %v after the first refused job's write began", failed, jobs, after.Round(10*time.Millisecond))
	if after > 5*time.Second {
		t.Errorf("/readyz failed %v after the first refused write; want within 5 s", after)
	}

	// The operator frees space. JetStream keeps the stream's write error:
	// its writes are still refused, and /readyz still says so.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	perr := blob.New(js, blob.Config{}).ProbeWrite(pctx)
	pcancel()
	if perr == nil {
		t.Fatal("with space freed, the object store took a write before NATS restarted: the docs say a restart is needed")
	}
	t.Logf("space freed, NATS not restarted: the object store still refuses writes (%v)", perr)
	if ready() {
		t.Error("/readyz is ready with the object store still refusing writes")
	}
	// ... and restarts the NATS server: everything recovers by itself.
	n.Restart()
	testkit.Eventually(t, 30*time.Second, "the API and the worker ready after the NATS restart", func() bool {
		ok, _ := w.Readiness(ctx)
		return ok && ready()
	})
	sub, err := api.Submit(ctx, job.Spec{Runtime: "python", Code: "print('after')", Cache: job.CacheOff()})
	if err != nil {
		t.Fatal(err)
	}
	v, err := api.Wait(ctx, sub.ID)
	if err != nil || v.Status != job.StatusSucceeded || len(v.Stdout) != 1<<20 {
		t.Fatalf("a job after the restart: %v %s %+v, %d bytes of stdout", err, v.Status, v.Error, len(v.Stdout))
	}
}
