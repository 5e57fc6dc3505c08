package mcpserver

import (
	"sync"
	"time"
)

// DisconnectGraceDefault is Config.DisconnectGrace's default: longer than
// the official SDKs take to reopen a dropped stream (the TypeScript SDK's
// two retries, 1 s and 1.5 s apart).
const DisconnectGraceDefault = 10 * time.Second

// A streamable HTTP client that goes away without deleting its session
// (the TypeScript SDK's close() only aborts its requests) leaves a session
// the SDK would keep forever, and with sessions on, a Kiln session held for
// nobody. Such a client is seen by its standalone GET stream (the one a
// client keeps open for the server's messages) being cut: when the stream of
// a session is cut by its client and the session then has no request in
// flight and starts none for DisconnectGrace, the session is closed as one
// the client deleted.

// httpSessions tracks the requests of each streamable HTTP session.
type httpSessions struct {
	grace time.Duration
	gone  func(id string) // closes the MCP session id

	mu sync.Mutex
	m  map[string]*httpSession // sessions with a request in flight, or a stream cut
}

type httpSession struct {
	open  int         // requests of the session in flight
	cut   bool        // its GET stream was cut by the client, and none opened since
	timer *time.Timer // set while cut and nothing is in flight
}

// begin notes a request of session id starting (get: a GET, its stream).
func (h *httpSessions) begin(id string, get bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]*httpSession{}
	}
	st := h.m[id]
	if st == nil {
		st = &httpSession{}
		h.m[id] = st
	}
	st.open++
	if get {
		st.cut = false
	}
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// end notes a request of session id ending; cut: it was a GET stream its
// client cut.
func (h *httpSessions) end(id string, cut bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.m[id]
	if st == nil {
		return
	}
	st.open--
	if cut {
		st.cut = true
	}
	switch {
	case st.open > 0:
	case st.cut:
		st.timer = time.AfterFunc(h.grace, func() { h.expire(id, st) })
	default:
		delete(h.m, id)
	}
}

// forget drops session id (deleted by its client).
func (h *httpSessions) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.m[id]; st != nil && st.timer != nil {
		st.timer.Stop()
	}
	delete(h.m, id)
}

// expire closes session id if its client is still gone.
func (h *httpSessions) expire(id string, st *httpSession) {
	h.mu.Lock()
	if h.m[id] != st || st.open > 0 || !st.cut {
		h.mu.Unlock()
		return
	}
	delete(h.m, id)
	h.mu.Unlock()
	h.gone(id)
}
