package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// The fleet issue's acceptance 6: a job that prints 16 MiB of \x01 on stdout
// and 16 MiB of '<' on stderr (each exactly the largest output limit a job may ask for). Its
// output is kept in the object store, so the largest value it leaves in
// Redis is well under 1 MB; every reader (GET, a cache hit, SSE) gets the
// exact bytes; and while four clients read the result over and over, other
// clients' submissions are answered as fast as before.
func TestBigControlByteOutputStaysOutOfRedis(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-big", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const n = 16 << 20
	code := fmt.Sprintf("import sys\nsys.stdout.buffer.write(b'\\x01' * %d)\nsys.stdout.buffer.flush()\nsys.stderr.buffer.write(b'<' * %d)\nsys.stderr.buffer.flush()\n", n, n)
	spec := job.Spec{Runtime: "python", Code: code, Limits: job.Limits{OutputBytes: n}}
	sub, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantOut, wantErr := strings.Repeat("\x01", n), strings.Repeat("<", n)
	check := func(what string, st job.Status, stdout, stderr string, outBytes, errBytes int64, outTrunc, errTrunc bool) {
		t.Helper()
		if st != job.StatusSucceeded || stdout != wantOut || stderr != wantErr || outBytes != n || errBytes != n || outTrunc || errTrunc {
			t.Fatalf("%s: status %s, stdout %d bytes (right: %v), stderr %d bytes (right: %v), counted %d/%d, truncated %v/%v",
				what, st, len(stdout), stdout == wantOut, len(stderr), stderr == wantErr, outBytes, errBytes, outTrunc, errTrunc)
		}
	}
	check("GET", v.Status, v.Stdout, v.Stderr, v.StdoutBytes, v.StderrBytes, v.StdoutTruncated, v.StderrTruncated)

	// The same job again is a cache hit, answered with the same output.
	hit, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !hit.CacheHit {
		t.Fatalf("the second submission was not a cache hit: %+v", hit.Status)
	}
	check("cache hit", hit.Status, hit.Stdout, hit.Stderr, hit.StdoutBytes, hit.StderrBytes, hit.StdoutTruncated, hit.StderrTruncated)

	// The event stream of the ended job carries the whole result.
	resp, err := http.Get(e.apiURL + "/v1/jobs/" + sub.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	var ev job.Result
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 256<<20)
	for sc.Scan() {
		if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok {
			if err := json.Unmarshal(d, &ev); err != nil {
				t.Fatalf("event data is not a result: %v: %d bytes: %.200q ... %q", err, len(d), d, d[max(0, len(d)-200):])
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read the event stream: %v", err)
	}
	resp.Body.Close()
	check("result event", ev.Status, ev.Stdout, ev.Stderr, ev.StdoutBytes, ev.StderrBytes, ev.StdoutTruncated, ev.StderrTruncated)

	// The largest value in Redis.
	rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr()})
	defer rdb.Close()
	var largest int64
	var largestKey string
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		size, err := rdb.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			t.Fatalf("memory usage of %s: %v", k, err)
		}
		if size > largest {
			largest, largestKey = size, k
		}
	}
	t.Logf("%d keys in Redis; the largest is %s at %d bytes (the job printed %d bytes)", len(keys), largestKey, largest, 2*n)
	if largest > 256<<10 {
		t.Errorf("a Redis value of %d bytes (%s): output should be in the object store", largest, largestKey)
	}

	// Submissions while four clients read the result.
	submitTimes := func(k int) []time.Duration {
		var d []time.Duration
		for i := range k {
			start := time.Now()
			s, err := e.api.Submit(ctx, py("print(%d)", i))
			if err != nil {
				t.Fatalf("submission %d: %v", i, err)
			}
			d = append(d, time.Since(start))
			_ = s
		}
		slices.Sort(d)
		return d
	}
	before := submitTimes(10)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, readBytes int64
	var mu sync.Mutex
	reading := make(chan struct{}, 4) // a reader's first answer is coming in
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := true; ; first = false {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Get(e.apiURL + "/v1/jobs/" + sub.ID)
				if err != nil {
					t.Errorf("read the result: %v", err)
					return
				}
				if first {
					reading <- struct{}{}
				}
				m, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("read the result: %d, %v", resp.StatusCode, err)
					return
				}
				mu.Lock()
				reads++
				readBytes += m
				mu.Unlock()
			}
		}()
	}
	// The readers are under way: each one's answer is coming in.
	for range 4 {
		testkit.Receive(t, reading, 30*time.Second, "a reader's answer to start")
	}
	during := submitTimes(10)
	close(stop)
	wg.Wait()
	t.Logf("submission latency (median / max): %v / %v alone, %v / %v while 4 clients read the result (%d reads, %d MB)",
		before[len(before)/2], before[len(before)-1], during[len(during)/2], during[len(during)-1], reads, readBytes>>20)
	if reads == 0 {
		t.Error("no read of the result finished while the submissions ran")
	}
	if during[len(during)-1] > 2*time.Second {
		t.Errorf("a submission took %v while the result was read", during[len(during)-1])
	}
}
