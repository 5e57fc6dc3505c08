// Package client is the Go client of Kiln's HTTP API: submit jobs (one or a
// batch), read and long-poll them, wait for their results, cancel them, and
// list runtimes. API errors are *Error values carrying the RFC 9457 problem
// the server sent, so callers branch on Status, Type or Field with errors.As
// instead of parsing text.
package client
