// Package mcpserver is Kiln's Model Context Protocol server: it offers the
// run tools (run_python, one per runtime the API knows) to any MCP client and
// runs their calls as jobs on a Kiln API, with input files in and artifacts
// out as resources and inline images. It is a client of the HTTP API (the
// URL and key `kiln mcp` takes from KILN_SERVER and KILN_API_KEY), so
// validation, the result cache and tenancy are the API's; the tool schema and
// the result text are the same as /v1/tools and /v1/tool-calls give.
package mcpserver
