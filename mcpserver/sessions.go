package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/internal/tooluse"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// With Config.Sessions, each MCP session gets Kiln sessions of its own (one
// per runtime), made at its first call of that runtime's tool, used by its
// later calls (what one call leaves, the next finds), and closed when the
// MCP session ends however it ends: the client closes it (stdio EOF, an
// HTTP DELETE), goes away (its HTTP streams cut: http.go), or the server
// stops (Close). A Kiln session that ended under the MCP session (its idle
// timeout, its lifetime) is replaced by a new one at the next call, which
// says what was lost.

// closeTimeout bounds closing one Kiln session.
const closeTimeout = 10 * time.Second

// mcpSessions maps MCP sessions to their Kiln sessions.
type mcpSessions struct {
	mu      sync.Mutex
	m       map[sessionKey]*kilnSession
	closing sync.WaitGroup // one per Kiln session made: until it is closed
}

type sessionKey struct {
	mcp     *mcp.ServerSession
	runtime string
}

type kilnSession struct {
	once   sync.Once
	s      *client.Session
	err    error
	closed chan struct{} // closed to close the Kiln session now (Close)
	stop   sync.Once
}

// session returns the Kiln session of ss for runtime, making it at first.
func (s *Server) session(ctx context.Context, ss *mcp.ServerSession, runtime string) (*client.Session, error) {
	key := sessionKey{ss, runtime}
	s.sessions.mu.Lock()
	if s.sessions.m == nil {
		s.sessions.m = map[sessionKey]*kilnSession{}
	}
	ks := s.sessions.m[key]
	if ks == nil {
		ks = &kilnSession{closed: make(chan struct{})}
		s.sessions.m[key] = ks
		s.sessions.closing.Add(1) // Done once it is closed, or was never made
	}
	s.sessions.mu.Unlock()
	ks.once.Do(func() {
		// Not given up with the call that makes it: the API may have made
		// the session already (it would idle until its timeout, unowned),
		// and other calls of the MCP session may be waiting on it here.
		sctx, stop := startContext(ctx)
		ks.s, ks.err = s.api.CreateSession(sctx, job.SessionSpec{Runtime: runtime})
		stop()
		if ks.err != nil {
			s.forget(key, ks)
			s.sessions.closing.Done()
			return
		}
		go func() {
			defer s.sessions.closing.Done()
			ended := make(chan struct{})
			go func() {
				_ = ss.Wait() // the MCP session ended: so does its Kiln session
				close(ended)
			}()
			select {
			case <-ended:
			case <-ks.closed:
			}
			s.forget(key, ks)
			s.closeKiln(ks.s)
		}()
	})
	return ks.s, ks.err
}

// closeSession closes the MCP session id (its client is gone): its Kiln
// sessions close with it.
func (s *Server) closeSession(id string) {
	for ss := range s.mcp.Sessions() {
		if ss.ID() == id {
			s.log.Info("closing an MCP session whose client went away", slog.String("mcp_session_id", id))
			_ = ss.Close()
		}
	}
}

// forget drops ks as key's Kiln session (if it still is).
func (s *Server) forget(key sessionKey, ks *kilnSession) {
	s.sessions.mu.Lock()
	defer s.sessions.mu.Unlock()
	if s.sessions.m[key] == ks {
		delete(s.sessions.m, key)
	}
}

// closeKiln ends a Kiln session, on a context of its own (the MCP
// session's has ended).
func (s *Server) closeKiln(ks *client.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	err := ks.Close(ctx)
	var ae *client.Error
	if err != nil && !(errors.As(err, &ae) && ae.Status == http.StatusNotFound) {
		s.log.Warn("close the Kiln session of an MCP session", slog.String("session_id", ks.ID), slog.Any("error", err))
	}
}

// Close ends every Kiln session the server's MCP sessions hold and waits
// (until ctx ends) for them to be closed. A process serving MCP calls it
// before it exits, so no Kiln session outlives it.
func (s *Server) Close(ctx context.Context) error {
	s.sessions.mu.Lock()
	for _, ks := range s.sessions.m {
		ks.stop.Do(func() { close(ks.closed) })
	}
	s.sessions.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.sessions.closing.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mcpserver: close Kiln sessions: %w", ctx.Err())
	}
}

// runInSession runs a tool call as the next call of its MCP session's Kiln
// session. A Kiln session that has ended (or is gone) is replaced once, and
// the result says what the new one lacks.
func (s *Server) runInSession(ctx context.Context, ss *mcp.ServerSession, def tooluse.Definition, in tooluse.Input, maxTimeout string) (*mcp.CallToolResult, error) {
	note := ""
	for attempt := 0; ; attempt++ {
		ks, err := s.session(ctx, ss, def.Runtime)
		if err != nil {
			if ctx.Err() != nil {
				return nil, rpcError(ctx.Err())
			}
			return s.apiFailure(ctx, err), nil
		}
		if err := ctx.Err(); err != nil {
			return nil, rpcError(err) // canceled while its session was made: the session stays, the call never starts
		}
		cr, err := runCall(ctx, ks, in.SessionCall())
		if err != nil && attempt == 0 && sessionGone(err) {
			// Ended under us (idle, lifetime, deleted): a new one.
			s.sessions.mu.Lock()
			if old := s.sessions.m[sessionKey{ss, def.Runtime}]; old != nil && old.s == ks {
				old.stop.Do(func() { close(old.closed) })
				delete(s.sessions.m, sessionKey{ss, def.Runtime})
			}
			s.sessions.mu.Unlock()
			note = "the Kiln session of this conversation had ended (" + goneDetail(err) + "); this call ran in a new one: " +
				"variables, imports and files of the calls before are gone. Run again what the next steps need."
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, rpcError(ctx.Err())
			}
			return s.apiFailure(ctx, err), nil
		}
		if note != "" {
			cr.StateRestored, cr.SessionNote = false, note
		}
		return s.result(ctx, tooluse.RenderCall(ks.ID, cr, maxTimeout)), nil
	}
}

// runCall runs call in Kiln session ks and waits for its result. A tool
// call its client cancels (notifications/cancelled, or the client gone)
// cancels the Kiln call too: the interpreter stops what it was running and
// keeps its state, as the session's own cancel does; a call still queued
// never runs. The call is started first so its seq is known from the
// start, and its start is not given up with the tool call (startContext).
func runCall(ctx context.Context, ks *client.Session, call job.SessionCall) (job.CallResult, error) {
	sctx, stop := startContext(ctx)
	cr, done, err := ks.Start(sctx, call)
	stop()
	if err != nil || done {
		return cr, err
	}
	seq := cr.Seq
	if err = ctx.Err(); err == nil {
		cr, err = ks.WaitCall(ctx, seq)
	}
	if err != nil && ctx.Err() != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelCallTimeout)
		defer cancel()
		_, _ = ks.CancelCall(cctx, seq) // best effort: the session's own timeout ends the call otherwise
	}
	return cr, err
}

// cancelCallTimeout bounds the cancel runCall sends for a canceled tool call.
const cancelCallTimeout = 10 * time.Second

// sessionGone reports whether err says the Kiln session has ended or is
// not there (410, 404): a call there can never succeed.
func sessionGone(err error) bool {
	var ae *client.Error
	return errors.As(err, &ae) && (ae.Type == string(job.ProblemSessionEnded) || ae.Status == http.StatusNotFound)
}

func goneDetail(err error) string {
	var ae *client.Error
	if errors.As(err, &ae) && ae.Detail != "" {
		return ae.Detail
	}
	return err.Error()
}
