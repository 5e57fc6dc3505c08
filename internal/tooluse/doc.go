// Package tooluse turns Kiln's runtimes into tools a language model can call
// and Kiln results into the tool results it reads, in the shapes of the
// model vendors' APIs (Anthropic Messages, OpenAI Chat Completions) and for
// the MCP server. It does no I/O: the API's /v1/tools and /v1/tool-calls
// routes and `kiln mcp` share it, so a tool looks and answers the same
// whichever way an agent reaches it. A result's display outputs become text
// (outputs.go: markdown, HTML reduced to text, or text/plain) and image
// blocks, its exception the exception_* lines.
package tooluse
