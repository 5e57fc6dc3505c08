// Package outcome is the judgement: it turns how a job ended and what it
// used into the status, failure category, message, exit code and signal a
// client is told.
//
// Decide is the only place that decides a status. Classifiers (one per
// runtime profile's "classifier", classify.go) read what an interpreter
// prints when a program fails, to give a failed job a category and a
// one-line message instead of a traceback.
//
// Seam: the sandbox gathers an Ending after the task exited (kiln-init's
// report, its own timer and cancellation, the cgroup's Usage, the stderr
// tail) and calls Decide; nothing here touches containerd, the host or the
// job's files, so every rule is table-tested in outcome_test.go.
//
// Invariants: only the runtime's own observations decide a status: its
// timer, its cancellation, the cgroup's counters and kiln-init's report,
// which the job cannot forge (package initproto). Nothing a program prints
// or exits with makes a job internal_error; a classifier only refines the
// category and message of a job that already failed, never its status.
package outcome
