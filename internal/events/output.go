package events

import (
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

// Bounds on a job's live output.
const (
	// FlushInterval is how often pending output is published: at most ten
	// messages a second per stream.
	FlushInterval = 100 * time.Millisecond
	// MaxChunk is the largest output event.
	MaxChunk = 64 << 10
	// maxPending is the output held between flushes per stream; what comes
	// faster than it can be published is left out of the live view (the
	// stored output has it), and an output_skipped event says where and how
	// much.
	maxPending = 1 << 20
)

// gap is output left out of the live view: bytes of it, at offset at of
// the stream's pending bytes.
type gap struct {
	at    int
	bytes int64
}

// Output coalesces one job's stdout and stderr into output events: at most
// one per stream per FlushInterval, each at most MaxChunk bytes, and in all
// at most the job's output cap per stream, like the stored output.
type Output struct {
	nc  *nats.Conn
	id  string
	cap int64

	mu      sync.Mutex
	red     [2]*redact.Stream // nil: output is sent as written
	wrote   [2]bool           // written since the last flush
	pending [2][]byte
	gaps    [2][]gap // where pending skips output, in order
	sent    [2]int64 // bytes of the stream taken for publishing or skipped, per stream
	onErr   func(error)

	stop chan struct{}
	done chan struct{}
}

// NewOutput starts the coalescer of job id's output; capBytes is the job's
// per-stream output cap. onErr (may be nil) hears publish failures.
func NewOutput(nc *nats.Conn, id string, capBytes int64, onErr func(error)) *Output {
	o := &Output{nc: nc, id: id, cap: capBytes, onErr: onErr, stop: make(chan struct{}), done: make(chan struct{})}
	go o.loop()
	return o
}

// NewRedactedOutput is NewOutput with each stream redacted by d before it
// is published: a key split across two writes is caught, at the cost of
// holding back the stream's last bytes (redact.Stream) until more output
// comes, the line is complete and the stream idle, or the job ends.
func NewRedactedOutput(nc *nats.Conn, id string, capBytes int64, d *redact.Detector, onErr func(error)) *Output {
	o := &Output{nc: nc, id: id, cap: capBytes, onErr: onErr, stop: make(chan struct{}), done: make(chan struct{})}
	if !d.Off() {
		o.red = [2]*redact.Stream{d.Stream(), d.Stream()}
	}
	go o.loop()
	return o
}

func streamIndex(stream string) int {
	if stream == "stderr" {
		return 1
	}
	return 0
}

// Write takes a chunk of the program's output. It never blocks on NATS.
func (o *Output) Write(stream string, p []byte) {
	i := streamIndex(stream)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.red[i] != nil {
		o.wrote[i] = true
		p = o.red[i].Write(p)
	}
	o.take(i, p)
}

// take adds p to stream i's pending bytes, within the bounds. What the
// job's output cap leaves out is left out of the stored output too; what
// only the pending bound leaves out is a gap, published as an
// output_skipped event where it happened. Holds o.mu.
func (o *Output) take(i int, p []byte) {
	capRoom := max(o.cap-o.sent[i], 0)
	n := min(int64(len(p)), capRoom, int64(max(maxPending-len(o.pending[i]), 0)))
	o.pending[i] = append(o.pending[i], p[:n]...)
	skipped := min(int64(len(p)), capRoom) - n
	o.sent[i] += n + skipped
	if skipped == 0 {
		return
	}
	at := len(o.pending[i])
	if g := o.gaps[i]; len(g) > 0 && g[len(g)-1].at == at {
		g[len(g)-1].bytes += skipped
		return
	}
	o.gaps[i] = append(o.gaps[i], gap{at: at, bytes: skipped})
}

func (o *Output) loop() {
	defer close(o.done)
	t := time.NewTicker(FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-o.stop:
			o.release(true)
			o.flush(true)
			return
		case <-t.C:
			o.release(false)
			o.flush(false)
		}
	}
}

// release moves what the redacting streams hold to pending: all of it at
// the end, else the complete lines of a stream nothing was written to since
// the last tick.
func (o *Output) release(final bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, r := range o.red {
		switch {
		case r == nil:
		case final:
			o.take(i, r.Flush())
		case !o.wrote[i]:
			o.take(i, r.Idle())
		}
		o.wrote[i] = false
	}
}

// flush publishes one chunk per stream, or, with all, everything pending,
// with an output_skipped event at each gap it reaches.
func (o *Output) flush(all bool) {
	for i, typ := range [2]string{job.EventStdout, job.EventStderr} {
		for {
			o.mu.Lock()
			if g := o.gaps[i]; len(g) > 0 && g[0].at == 0 {
				o.gaps[i] = g[1:]
				o.mu.Unlock()
				o.publish(job.EventOutputSkipped, job.SkippedEvent{Stream: typ, Bytes: g[0].bytes})
				continue
			}
			upTo := o.pending[i]
			if g := o.gaps[i]; len(g) > 0 {
				upTo = upTo[:g[0].at]
			}
			chunk := cut(upTo, all || len(upTo) < len(o.pending[i]))
			o.pending[i] = o.pending[i][len(chunk):]
			for k := range o.gaps[i] {
				o.gaps[i][k].at -= len(chunk)
			}
			if len(o.pending[i]) == 0 {
				o.pending[i] = nil
			}
			o.mu.Unlock()
			if len(chunk) == 0 {
				break
			}
			o.publish(typ, job.NewOutputEvent(chunk))
			if !all {
				break
			}
		}
	}
}

// publish sends one event, telling onErr of a failure.
func (o *Output) publish(typ string, data any) {
	if err := Publish(o.nc, o.id, typ, data); err != nil && o.onErr != nil {
		o.onErr(err)
	}
}

// cut returns the next chunk of b to publish: at most MaxChunk bytes, ending
// on a whole UTF-8 character when b is text, so a character split across two
// writes is not sent as two invalid halves. Unless final, an incomplete
// character at the very end waits for its remaining bytes.
func cut(b []byte, final bool) []byte {
	n := min(len(b), MaxChunk)
	if final && n == len(b) {
		return b
	}
	// Step back over at most 3 bytes to the start of a character that does not fit.
	for k := 0; k < utf8.UTFMax-1 && n-k > 0; k++ {
		if utf8.RuneStart(b[n-k-1]) {
			if r, size := utf8.DecodeRune(b[n-k-1 : n]); r == utf8.RuneError && size <= 1 && !utf8.FullRune(b[n-k-1:n]) {
				return b[:n-k-1]
			}
			break
		}
	}
	return b[:n]
}

// Close publishes what is pending and stops the coalescer. Call it before
// publishing the job's end, so every output event precedes it.
func (o *Output) Close() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	<-o.done
}
