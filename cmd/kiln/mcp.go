package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kilnrun/kiln/mcpserver"
)

func init() {
	register("mcp", "serve the run tools to MCP clients (stdio, or streamable HTTP with --http)", cmdMCP)
}

// cmdMCP runs the MCP server against the API at KILN_SERVER (key from
// KILN_API_KEY): over stdio by default, as desktop clients start it, or
// over streamable HTTP at --http ADDR (clients then send KILN_MCP_TOKEN as a
// bearer token when it is set; required beyond loopback). Logs go to
// stderr, never stdout.
func cmdMCP(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln mcp", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var addr, level, budget string
	stringVar(fs, &addr, "http", "KILN_MCP_HTTP", "", "serve streamable HTTP at this address (e.g. 127.0.0.1:8090) instead of stdio")
	stringVar(fs, &level, "log-level", "KILN_LOG_LEVEL", "warn", "log level (debug, info, warn, error), logged to stderr")
	stringVar(fs, &budget, "budget", "KILN_BUDGET", "", "execution budget id (POST /v1/budgets) every call's job names")
	var sessions string
	stringVar(fs, &sessions, "sessions", "KILN_MCP_SESSIONS", "off", "on: each MCP session's calls share one Kiln session (variables and files persist); off: every call in a fresh sandbox")
	if err := parseFlags(fs, args); err != nil {
		return 2
	}
	log, err := newLogger("mcp", level)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	srv, err := mcpserver.New(ctx, mcpserver.Config{BaseURL: cf.server, APIKey: os.Getenv("KILN_API_KEY"), Budget: budget, Logger: log,
		Sessions: sessions == "on"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln mcp:", err)
		return 1
	}
	if addr == "" {
		if err := srv.ServeStdio(ctx, &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "kiln mcp:", err)
			return 1
		}
		return 0
	}
	// Whoever reaches the endpoint runs code with this process's API key:
	// beyond loopback, demand a token of them.
	token := os.Getenv("KILN_MCP_TOKEN")
	if token == "" && !mcpserver.Loopback(addr) {
		fmt.Fprintf(os.Stderr, "kiln mcp: --http %s accepts connections from other hosts; set KILN_MCP_TOKEN so clients must send it as a bearer token, or listen on 127.0.0.1\n", addr)
		return 2
	}
	code := serveMCPHTTP(ctx, log, addr, srv.HTTPHandler(token))
	// No Kiln session outlives the server that made it.
	cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := srv.Close(cctx); err != nil {
		log.WarnContext(ctx, "close the MCP sessions' Kiln sessions", slog.Any("error", err))
	}
	return code
}

// serveMCPHTTP serves the streamable HTTP transport at /mcp (and /) until
// ctx ends.
func serveMCPHTTP(ctx context.Context, log *slog.Logger, addr string, h http.Handler) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln mcp:", err)
		return 1
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.InfoContext(ctx, "MCP server listening", slog.String("url", "http://"+ln.Addr().String()+"/mcp"))
	fmt.Fprintf(os.Stderr, "kiln mcp: streamable HTTP at http://%s/mcp\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		fmt.Fprintln(os.Stderr, "kiln mcp:", err)
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.WarnContext(ctx, "MCP HTTP shutdown", slog.Any("error", err))
	}
	return 0
}
