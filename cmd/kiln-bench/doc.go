// Command kiln-bench measures how long a trivial job (print(1)) takes through
// each layer of Kiln and its baselines, all in the same run, and prints the
// median and p99 of each row and the ratios between rows. `make bench` runs
// it; docs/benchmarks.md describes the sections and keeps dated figures.
//
// Rows come in sections; each section lives in its own file and registers
// itself with register (sandbox.go: the bare interpreter, ctr run, kiln exec;
// pipeline.go: the same program through the HTTP API, JetStream, a worker and
// Redis; paths.go, sessions.go, isolation.go, launcher.go and others). A
// section prepares its rows (and their clean-up) once; rows then run
// interleaved, one run of each per round in a shuffled order, so drift on the
// host and what one row leaves running in the background hit all rows alike.
// Measurements that cannot share a round (load at several concurrencies,
// cache-hit rates, saturation) run afterwards as a section's Phase.
//
// Seam: it drives the real packages (producer, worker, sandbox,
// cache) in process, with a private redis-server and embedded NATS.
//
// Invariants: it never touches the operator's Redis or NATS, removes what it
// started (on an interrupt too), and a missed target is printed, never a
// failure.
package main
