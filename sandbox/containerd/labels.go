package containerd

// Labels on every container and snapshot the runtime creates: a sandbox's
// labels are its own life's, never a job's (a pooled sandbox or a box is
// made before its job, and a box serves many).
const (
	LabelManaged = "kiln.managed" // "true"
	LabelJobID   = "kiln.job.id"
	LabelWorker  = "kiln.worker"
	// LabelRootfs marks an image's shared read-only root view; its value is
	// the image's layer chain id.
	LabelRootfs = "kiln.rootfs"
	// LabelDeadline is when the sandbox has outlived its wall-clock limit
	// (Unix milliseconds): any worker on the host removes it after that,
	// whether or not its own worker is still there (ReapExpired).
	LabelDeadline = "kiln.deadline"
	// LabelLeaseScope names the store whose worker leases decide whether
	// the sandbox's worker is gone (sandbox.Config.LeaseScope).
	LabelLeaseScope = "kiln.lease-scope"
	// LabelPool marks a sandbox prepared ahead of its job (the warm pool, a
	// box, a session's spare); its value is the pool class's key.
	LabelPool = "kiln.pool"
	// LabelSession marks a session's box; its value is the session id.
	LabelSession = "kiln.session"
)
