package producer

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/events"
	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// sseClient opens an event stream over a raw connection with a small
// receive buffer, and returns the connection and the answer's status. It
// reads the answer's head and nothing more: a reader that never reads.
func sseClient(t *testing.T, b *bundle, key, id string, hdr ...string) (net.Conn, *bufio.Reader, int) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(b.http.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	extra := ""
	for i := 0; i+1 < len(hdr); i += 2 {
		extra += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	fmt.Fprintf(conn, "GET /v1/jobs/%s/events HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\n%s\r\n", id, key, extra)
	br := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("stream of %s: %v", id, err)
	}
	if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After")
	}
	return conn, br, resp.StatusCode
}

// nextEvent reads the next event (id, type) of an open stream, skipping comments.
func nextEvent(t *testing.T, br *bufio.Reader) (id, typ string) {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read event: %v", err)
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "event: "):
			typ = line[7:]
		case line == "" && typ != "":
			return id, typ
		}
	}
}

// heapInUse is the API process's heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// Issue 23, acceptance 3: of one tenant's 200 never-reading event streams
// on jobs with 8 MiB of output each, its bound's worth are served and the
// rest refused with 429; the API's heap grows by a bounded amount (each
// stream holds at most eventsPullBytes of events); another tenant's stream
// works meanwhile with ids counting its job's events alone; and once the
// readers go, their consumers are gone from JetStream. Not parallel: it
// measures the process's heap.
func TestEventStreamsBounded(t *testing.T) {
	b := setup(t, func(c *Config) { c.APIKeys = map[string]string{"k-hog": "hog", "k-calm": "calm"} })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	submitAs := func(key string) string {
		return accepted(t, b.submit(t, `{"code":"print(1)","cache":false}`, "Authorization", "Bearer "+key)).ID
	}
	var hogJobs []string
	for range 4 {
		hogJobs = append(hogJobs, submitAs("k-hog"))
	}
	calm := submitAs("k-calm")
	chunk := strings.Repeat("x", events.MaxChunk-64)
	for i := range 128 { // 8 MiB per job, interleaved with the other tenant's events
		for _, id := range hogJobs {
			if err := events.Publish(b.nc, id, job.EventStdout, job.OutputEvent{Data: chunk}); err != nil {
				t.Fatal(err)
			}
		}
		if i%32 == 0 {
			if err := events.Publish(b.nc, calm, job.EventStdout, job.OutputEvent{Data: fmt.Sprintf("calm %d\n", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := b.js.Stream(ctx, job.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the events to be stored", func() bool {
		info, err := evs.Info(ctx)
		return err == nil && info.State.Msgs >= 4*128+4+5
	})

	before := heapInUse()
	served, refused := 0, 0
	var conns []net.Conn
	for i := range 200 {
		conn, _, status := sseClient(t, b, "k-hog", hogJobs[i%len(hogJobs)])
		switch status {
		case http.StatusOK:
			served++
			conns = append(conns, conn)
		case http.StatusTooManyRequests:
			refused++
			conn.Close()
		default:
			t.Fatalf("stream %d: status %d", i, status)
		}
	}
	if served != EventStreamsDefault || refused != 200-EventStreamsDefault {
		t.Fatalf("%d streams served, %d refused; want %d served", served, refused, EventStreamsDefault)
	}
	// Wait until the served streams have taken what they will take: their
	// consumers' deliveries stop moving.
	var last uint64
	steady := 0
	testkit.Eventually(t, 10*time.Second, "the stalled streams to stop taking events", func() bool {
		var n uint64
		for ci := range evs.ListConsumers(ctx).Info() {
			n += ci.Delivered.Consumer
		}
		if n == last {
			steady++
		} else {
			steady, last = 0, n
		}
		return steady >= 5
	})
	growth := int64(heapInUse()) - int64(before)
	t.Logf("API heap growth with %d stalled streams on 8 MiB of events each: %.1f MiB (%d events delivered to them)", served, float64(growth)/(1<<20), last)
	// The process embeds the NATS server: its block cache (~24 MiB here)
	// counts too. Streams that buffered what they were sent (the API
	// before the bound) held 61 MiB and more.
	if growth > 64<<20 {
		t.Errorf("heap grew %d MiB for %d stalled streams: want bounded by ~%d × %d KiB plus NATS's cache", growth>>20, served, served, eventsPullBytes>>10)
	}

	// The other tenant: its stream is served, and its ids count its job's events alone.
	conn, br, status := sseClient(t, b, "k-calm", calm)
	if status != http.StatusOK {
		t.Fatalf("the other tenant's stream: %d", status)
	}
	for want := 1; want <= 3; want++ {
		id, typ := nextEvent(t, br)
		if id != fmt.Sprint(want) {
			t.Fatalf("event %d of the other tenant's job has id %q (%s): want per-job ids", want, id, typ)
		}
	}
	conn.Close()
	// Resuming after id 2 gives the third event, id 3.
	conn, br, _ = sseClient(t, b, "k-calm", calm, "Last-Event-ID", "2")
	if id, typ := nextEvent(t, br); id != "3" || typ != job.EventStdout {
		t.Fatalf("resumed after 2: first event %q %s, want 3 stdout", id, typ)
	}
	conn.Close()

	// Per job: a job's fifth stream is refused even when the tenant has room.
	// The two streams just closed count until the server sees them end.
	testkit.Eventually(t, 10*time.Second, "the other tenant's closed streams to be released", func() bool { return b.srv.events.streams.open("calm") == 0 })
	for i := range EventStreamsPerJobDefault {
		if _, _, st := sseClient(t, b, "k-calm", calm); st != http.StatusOK {
			t.Fatalf("calm stream %d: %d", i, st)
		}
	}
	if _, _, st := sseClient(t, b, "k-calm", calm); st != http.StatusTooManyRequests {
		t.Fatalf("a job's fifth stream: %d, want 429", st)
	}

	// Readers gone: every consumer is removed from JetStream at once.
	for _, c := range conns {
		c.Close()
	}
	testkit.Eventually(t, 10*time.Second, "the hog's consumers to be removed", func() bool { return b.srv.events.streams.open("hog") == 0 })
	testkit.Eventually(t, 10*time.Second, "the consumers to be removed", func() bool {
		info, err := evs.Info(ctx)
		return err == nil && info.State.Consumers == EventStreamsPerJobDefault // the other tenant's open streams
	})
}

// A reader that takes nothing is cut off after EventStallTimeout, and its
// slot given back.
func TestEventStreamStallCutOff(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.EventStallTimeout = 300 * time.Millisecond
		c.Tenants = map[string]Tenant{job.DefaultTenant: {Bounds: Bounds{EventStreams: 1}}}
	})
	id := accepted(t, b.submit(t, `{"code":"print(1)","cache":false}`)).ID
	chunk := strings.Repeat("y", events.MaxChunk-64)
	for range 64 {
		if err := events.Publish(b.nc, id, job.EventStdout, job.OutputEvent{Data: chunk}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, st := sseClient(t, b, "", id); st != http.StatusOK {
		t.Fatalf("first stream: %d", st)
	}
	if _, _, st := sseClient(t, b, "", id); st != http.StatusTooManyRequests {
		t.Fatalf("second stream over a bound of 1: %d", st)
	}
	testkit.Eventually(t, 10*time.Second, "the stalled stream to be cut off", func() bool { return b.srv.events.streams.open(job.DefaultTenant) == 0 })
}
