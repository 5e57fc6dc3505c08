package cache

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// A holder's take of its next call whose reply is lost (the connection
// dropped after Redis ran the script: a read timeout, the server killed
// after its write) is asked again, by the client's own retry or by the
// worker's next ask. The call is the holder's to run, once: it is not
// reported interrupted as if an earlier holder had lost it.
func TestNextCallRepeatedAfterALostReply(t *testing.T) {
	t.Parallel()
	_, r := setup(t, Config{})
	p := newLossyProxy(t, r.Addr())
	s, err := New(t.Context(), Config{URL: "redis://" + p.addr() + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, now := t.Context(), time.Now()
	rec := newSession(t, s, "acme", now)
	inc, err := s.ClaimSession(ctx, rec.ID, "w1", "i1", 0)
	if err != nil {
		t.Fatal(err)
	}
	h := SessionHolder{Worker: "w1", Instance: "i1", Inc: inc}
	// No call waits yet: the script is loaded, so the reply dropped below
	// is the script's own, not a NOSCRIPT.
	if state, _, _, err := s.NextCall(ctx, rec.ID, h, now); err != nil || state != 0 {
		t.Fatalf("no call yet: %d %v", state, err)
	}
	if _, _, err := s.EnqueueCall(ctx, "acme", rec.ID, job.SessionCall{Code: "a"}, "", 4, now); err != nil {
		t.Fatal(err)
	}
	p.dropNextReply()
	state, seq, spec, err := s.NextCall(ctx, rec.ID, h, now)
	if !p.dropped() {
		t.Fatal("the proxy dropped no reply: the test did not test a lost reply")
	}
	if errors.Is(err, ErrUnavailable) {
		// The client did not repeat it itself: the worker asks again.
		state, seq, spec, err = s.NextCall(ctx, rec.ID, h, now)
	}
	if err != nil || state != CallRun || seq != 1 || string(spec) != `{"code":"a"}` {
		t.Fatalf("the holder's call, asked again after a lost reply: state %d seq %d spec %s err %v; want it to run (state %d)", state, seq, spec, err, CallRun)
	}
	// A later holder still finds it running under an incarnation that
	// was lost, and never runs it.
	inc, err = s.ClaimSession(ctx, rec.ID, "w2", "i2", h.Inc)
	if err != nil {
		t.Fatal(err)
	}
	if state, seq, _, err := s.NextCall(ctx, rec.ID, SessionHolder{Worker: "w2", Instance: "i2", Inc: inc}, now); err != nil || state != CallInterrupted || seq != 1 {
		t.Fatalf("a later holder: state %d seq %d err %v; want interrupted", state, seq, err)
	}
}

// lossyProxy forwards TCP to a Redis server; armed, it drops the next
// reply the server sends and closes that client connection, as a server
// killed after its write, or a client's read timeout, would.
type lossyProxy struct {
	ln     net.Listener
	target string
	arm    atomic.Bool
	lost   atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func newLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *lossyProxy) addr() string   { return p.ln.Addr().String() }
func (p *lossyProxy) dropNextReply() { p.arm.Store(true) }
func (p *lossyProxy) dropped() bool  { return p.lost.Load() }

func (p *lossyProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() {
			_, _ = io.Copy(s, c)
			_ = s.Close()
		})
		p.wg.Go(func() { p.replies(c, s) })
	}
}

// replies copies the server's replies to the client, but for the one
// dropped when armed.
func (p *lossyProxy) replies(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 && p.arm.CompareAndSwap(true, false) {
			p.lost.Store(true)
			return
		}
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
