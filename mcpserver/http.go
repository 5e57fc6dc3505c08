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
// the SDK's DNS-rebinding protection and cross-origin protection. When token
// is not empty every request must carry "Authorization: Bearer <token>":
// whoever reaches this endpoint runs code with the server's Kiln API key.
func (s *Server) HTTPHandler(token string) http.Handler {
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{Logger: s.log})
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
