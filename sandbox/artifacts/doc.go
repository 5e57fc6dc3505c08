// Package artifacts is what a job leaves for its result besides its exit and
// output: the files of its output dir, content-addressed (outdir.go), and
// its display outputs and exception from the launcher's output channel
// (display.go).
//
// CollectOutputDir walks a work dir's output dir after the job's last
// process is gone and hands each file it keeps to a Store; ReadOutputStream
// (a box's pipe, read as it fills) and ReadOutputsFile (a container's file,
// read once the job has ended) parse the channel; PlaceOutputs puts its
// outputs into the result, a value too long to carry inline stored as an
// artifact; AttachException gives a judged failure its exception.
//
// Seam: package sandbox says where the work dir and the channel are on the
// host, the caps, and the run's Store (sandboxapi.Request.Store), and calls
// these once the job can no longer write; nothing here knows containerd, a
// box or a tenant, so the unit tests plant links, FIFOs, deep trees and
// hostile channels in a temporary directory.
//
// Invariants: the host never follows a path the job controls: the walk is
// confined to the work dir with os.Root, opens only what its directory
// lists as a regular file, with O_NOFOLLOW|O_NONBLOCK, and checks with
// fstat what it opened before reading a byte; the channel's file is opened
// the same way. Every bound (files, bytes, entries, depth, outputs,
// inline bytes) is applied and what it cuts is counted in the result,
// never dropped silently. Nothing a program prints on stdout becomes an
// output.
package artifacts
