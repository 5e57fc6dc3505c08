// Package tooluse turns Kiln's runtimes into tools a language model can call
// and Kiln results into the tool results it reads, in the shapes of the
// model vendors' APIs (Anthropic Messages, OpenAI Chat Completions and
// Responses) and for the MCP server. A result's display outputs become
// text (outputs.go: markdown, HTML reduced to text, or text/plain) and
// image blocks, its exception the exception_* lines, and a failure says
// what can help. Chat Completions tool messages take text only: there the
// text ends by naming the images and where the API serves them.
//
// Seam: the API's /v1/tools and /v1/tool-calls routes and mcpserver call
// it with job types; it depends on package job alone.
//
// Invariants: it does no I/O; every surface renders a Result through the
// same code, so a tool looks and answers the same whichever way an agent
// reaches it.
package tooluse
