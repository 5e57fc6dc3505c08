// Package mcpserver is Kiln's Model Context Protocol server, behind `kiln
// mcp`: it offers the run tools (one per runtime the API knows, run_python
// first) to any MCP client over stdio or streamable HTTP, and runs their
// calls as jobs on a Kiln API, with input files in and artifacts out as
// resources and inline images. With sessions on, each MCP session's calls
// share one Kiln session.
//
// Seam: it is a client of the HTTP API (producer/client, with the URL and
// key `kiln mcp` takes from KILN_SERVER and KILN_API_KEY), and renders tools
// and results with internal/tooluse.
//
// Invariants: validation, the result cache and tenancy are the API's, never
// re-implemented here; the tool schema and the result text are the same as
// /v1/tools and /v1/tool-calls give; a call the client cancels, or whose
// answer can no longer reach it (stdio closed, its POST dropped, its HTTP
// session deleted: calls.go), cancels its job, or its Kiln session call
// (sessions.go runCall); progress notifications keep
// long calls alive.
package mcpserver
