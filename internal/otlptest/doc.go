// Package otlptest runs in-process OTLP trace receivers, over OTLP/HTTP
// (protobuf bodies, gzip or not) and OTLP/gRPC, that decode what exporters
// send: for tests that must see spans leave a process over the wire.
//
// Seam: a receiver's endpoint goes into the standard OTEL_EXPORTER_OTLP_*
// settings of the process under test; the test reads the received Spans.
//
// Invariants: test support only; it listens on loopback and is closed with
// the test.
package otlptest
