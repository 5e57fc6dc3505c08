package mcpserver

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTPHandler serves the server over MCP's streamable HTTP transport, with
// the SDK's DNS-rebinding protection and cross-origin protection. A call
// whose client goes away (its POST ends, or its session is deleted) before
// the answer is given up and its job canceled; a session whose client went
// away without deleting it is closed after DisconnectGrace (disconnect.go),
// its Kiln sessions with it. When token
// is not empty every request must carry "Authorization: Bearer <token>":
// whoever reaches this endpoint runs code with the server's Kiln API key.
func (s *Server) HTTPHandler(token string) http.Handler {
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{Logger: s.log})
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		if id != "" && r.Method != http.MethodDelete {
			// A client gone without a DELETE (disconnect.go).
			get := r.Method == http.MethodGet
			s.streams.begin(id, get)
			defer func() { s.streams.end(id, get && r.Context().Err() != nil) }()
		}
		switch r.Method {
		case http.MethodDelete:
			// The client ends its session: its calls are given up, and
			// their jobs canceled, as a notifications/cancelled would.
			if id != "" {
				s.calls.cancelSession(id)
				s.streams.forget(id)
			}
		case http.MethodPost:
			// The calls this POST carries are answered on its response
			// alone (calls.go): they follow its request's context.
			tag, done := s.posts.open(r.Context())
			defer done()
			r = r.Clone(r.Context())
			r.Header.Set(postHeader, tag)
		}
		sdk.ServeHTTP(w, r)
	})
	h = http.NewCrossOriginProtection().Handler(h)
	if token == "" {
		return h
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kiln-mcp"`)
			http.Error(w, "send the MCP token as \"Authorization: Bearer <token>\"", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Loopback reports whether a listen address only accepts local connections.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
