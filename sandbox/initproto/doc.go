// Package initproto holds the launcher protocols: the contract between the
// sandbox runtime (the worker), kiln-init (the pid 1 of a container
// sandbox), a box's zygote and a runtime's launcher. It owns the variables
// the worker passes the init, the readiness descriptor the init passes the
// launcher, the output-channel descriptor, the status report the init
// leaves for the worker (initproto.go), the job frame every launcher reads
// (frame.go), and the messages on a box's control socket: the job header,
// the parameters of a job's inner sandbox and the zygote's report (box.go).
//
// The protocol, in order:
//
//  1. The worker starts the container with kiln-init as its process and the
//     launcher's command line as kiln-init's arguments, and sets EnvNonce (a
//     fresh random secret per sandbox), EnvStatus (the path of the status
//     file, a host file bind-mounted into the container), EnvIdleMS and
//     EnvTimeoutMS in the process environment.
//  2. kiln-init makes itself non-dumpable (so no process of the job can read
//     /proc/1/environ, mem or fd, nor ptrace it), opens the status file,
//     removes every KILN_INIT_* variable from its environment, and starts the
//     launcher with a pipe's write end as descriptor ReadyFD, named in
//     EnvReadyFD.
//  3. The launcher reads the job, writes its input files, then writes one
//     byte to descriptor ReadyFD and closes it, before any code of the job
//     runs. A launcher that fails before that point is the platform's fault
//     (internal_error); anything after it is the program's.
//  4. kiln-init forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and
//     SIGUSR2 to the launcher, reaps every orphan, and kills everything
//     (kill(-1, SIGKILL)) when EnvIdleMS passes without readiness or
//     EnvTimeoutMS passes after it.
//  5. When the launcher has exited, kiln-init kills every other process,
//     reaps until none is left, then truncates the status file and writes one
//     Status as JSON, carrying the nonce.
//
// The launcher protocol is versioned (frame.go: Protocol, "major.minor"):
// every frame and box header starts "KILN/<version>", and BoxParams carry
// it. A launcher refuses another major with exit code LaunchError and a
// "kiln-launcher:" line naming both versions; a newer minor of its major
// only adds what it may ignore. testdata/ holds the shared vectors (frames,
// box headers and parameters, zygote reports, kiln-init's status; valid
// and invalid) that this package's tests, the Python launchers' tests and
// the Node launcher's tests (deploy/images/tests, run by
// launchers_test.go) all read.
//
// Seam: constants, wire types and their encodings only; sandbox
// writes the environment, the frames and the box messages and reads the
// status and the reports, cmd/kiln-init and the images' launchers
// (deploy/images/*) do the rest.
//
// Invariants: a leaf (kiln-init is a static binary and imports nothing else
// of Kiln). The job cannot forge a status: it never sees the nonce, and it is
// dead before the status is written; the worker ignores a status without the
// right nonce.
package initproto
