// Package testkit is what Kiln's tests share to wait on things: the one
// place a deadline loop lives (Eventually), receiving from a signal channel
// with a bound (Receive, Closed), a manual clock (Clock) for code that
// takes a clock in its config, and a scripted sandbox backend (Runtime, on
// NoSandbox: the optional parts of worker.Sandboxes answered as
// unsupported) for tests about the queue and the stores; and two fakes
// tests share: a log destination goroutines write to at once (SyncBuffer)
// and an artifact store in memory that checks what it is given (MemStore).
//
// Seam: helpers over testing.TB; components under test expose signal
// channels and take clocks in their configs, and tests wait on those.
//
// Invariants: tests wait on signals a component gives (a channel closed
// when a job is recorded, a pool refilled, a box retired) wherever one
// exists; Eventually is for state held by a real dependency (Redis, NATS,
// containerd) that offers no signal. Nothing here sleeps for a fixed time.
package testkit
