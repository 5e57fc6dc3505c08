// Command kiln is Kiln's single binary: the API server (api), the worker
// (worker), the all-in-one dev mode with an embedded NATS server (dev),
// client commands (submit, get, run, list, cancel, runtimes, and session's
// new, exec, files, rm and ls), the MCP server (mcp), and a direct sandbox
// runner (exec). The client commands print what a job made (its display
// outputs' text; images, HTML and other types saved as output-N files) and
// exit with the job's status.
//
// It owns flags, environment variables, the API key file (keyfile.go:
// tenants, quotas, bounds, cache groups, redaction settings) and the wiring
// of the packages into processes; each command registers itself from its own
// file.
//
// Seam: main looks a command up by name and runs it with its arguments;
// every command builds its own FlagSet (config.go gives every server flag an
// environment variable).
//
// Invariants: no business logic lives here; a flag on the command line wins
// over its variable; a variable that does not parse is an error naming it;
// every flag of every command is documented in docs/configuration.md
// (TestConfigurationDocumentsEveryFlag).
package main
