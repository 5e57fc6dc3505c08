package mcpserver

import (
	"context"
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
// MCP session ends.

// mcpSessions maps MCP sessions to their Kiln sessions.
type mcpSessions struct {
	mu sync.Mutex
	m  map[sessionKey]*kilnSession
}

type sessionKey struct {
	mcp     *mcp.ServerSession
	runtime string
}

type kilnSession struct {
	once sync.Once
	s    *client.Session
	err  error
}

// session returns the Kiln session of ss for runtime, making it at first.
func (s *Server) session(ctx context.Context, ss *mcp.ServerSession, runtime string) (*client.Session, error) {
	key := sessionKey{ss, runtime}
	s.sessions.mu.Lock()
	if s.sessions.m == nil {
		s.sessions.m = map[sessionKey]*kilnSession{}
	}
	ks := s.sessions.m[key]
	fresh := ks == nil
	if fresh {
		ks = &kilnSession{}
		s.sessions.m[key] = ks
	}
	s.sessions.mu.Unlock()
	ks.once.Do(func() {
		ks.s, ks.err = s.api.CreateSession(ctx, job.SessionSpec{Runtime: runtime})
		if ks.err != nil {
			s.sessions.mu.Lock()
			delete(s.sessions.m, key)
			s.sessions.mu.Unlock()
			return
		}
		go func() {
			_ = ss.Wait() // the MCP session ended: so does its Kiln session
			s.sessions.mu.Lock()
			delete(s.sessions.m, key)
			s.sessions.mu.Unlock()
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := ks.s.Close(cctx); err != nil {
				s.log.Warn("close the Kiln session of an MCP session", "session_id", ks.s.ID, "error", err)
			}
		}()
	})
	return ks.s, ks.err
}

// runInSession runs a tool call as the next call of its MCP session's Kiln
// session.
func (s *Server) runInSession(ctx context.Context, ss *mcp.ServerSession, def tooluse.Definition, in tooluse.Input, maxTimeout string) (*mcp.CallToolResult, error) {
	ks, err := s.session(ctx, ss, def.Runtime)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return s.apiFailure(ctx, err), nil
	}
	cr, err := ks.Exec(ctx, in.SessionCall())
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return s.apiFailure(ctx, err), nil
	}
	return s.result(ctx, tooluse.RenderCall(ks.ID, cr, maxTimeout)), nil
}
