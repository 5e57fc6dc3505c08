package producer

import (
	"errors"
	"time"

	"github.com/kilnrun/kiln/job"
)

// The errors of the domain calls: submit (submission.go) and the steps
// session calls share with it (quotas, budgets, egress). Each is a sentinel
// declared here once; the code that returns one wraps it with its context,
// as a *refusal when the client is to be told more than its name. The
// domain code never builds an HTTP answer: toProblem (problem.go) is the one
// mapping from these errors to problems (status, type, Retry-After), and
// every transport answers through it: POST /v1/jobs, batches, replays, tool
// calls and sessions alike.
var (
	// errNoRuntimes: the runtime registry is empty. Not the request's fault
	// (503 with Retry-After, not 422): the same request succeeds once a
	// worker registers.
	errNoRuntimes = errors.New("no runtime is registered right now (no worker has registered one yet, or the workers are registering again after the store lost its data)")
	// errIdempotencyKeyReused: the Idempotency-Key came with another request
	// body than the job it names.
	errIdempotencyKeyReused = errors.New("idempotency key reused with another request")
	// errQueueFull: the job stream is at its limit; nothing was queued.
	errQueueFull = errors.New("job queue full")
	// errQueueUnavailable: the job queue cannot take the job right now;
	// nothing was queued.
	errQueueUnavailable = errors.New("job queue unavailable")
	// errPublishUnconfirmed: the publish was sent and not confirmed in
	// time, so the job may be queued; its record is kept (publish.go).
	errPublishUnconfirmed = errors.New("job queue did not confirm the publish")
	// errQuotaExceeded: one of the tenant's quotas refuses the submission;
	// the refusal names which.
	errQuotaExceeded = errors.New("quota exceeded")
	// errBudgetInvalid: the job names a budget that is not one of its
	// tenant's live budgets.
	errBudgetInvalid = errors.New("invalid budget")
	// errBudgetExhausted: the job's budget cannot cover it; retrying will
	// not help.
	errBudgetExhausted = errors.New("budget exhausted")
	// errEgressNotAllowed: the job's network reaches beyond its tenant's
	// egress allowance.
	errEgressNotAllowed = errors.New("egress not allowed")

	// The refusals of a session's file operations (sessions_files.go), each
	// a state of the session's /work, so retrying the same operation does
	// not help until its files change: a path that is not there, and the
	// conflicts (errFileConflicts says which title each is answered with).
	errFileNotFound     = errors.New("no such file in the session's /work")
	errFileExists       = errors.New("a file is already there")
	errFileNotDir       = errors.New("not a directory")
	errFileIsDir        = errors.New("is a directory")
	errFileNotEmpty     = errors.New("directory not empty")
	errFileSymlink      = errors.New("a symbolic link is in the way")
	errFileMoveIntoSelf = errors.New("a directory cannot move under itself")
	errFilesFull        = errors.New("the session's files are at their bound")

	// errCommandNotFound: the session's interpreter holds no background
	// command of that id (sessions_commands.go).
	errCommandNotFound = errors.New("no such background command in the session")
	// errStdinClosed: a write to a background command's stdin found it
	// closed (sessions_commands.go).
	errStdinClosed = errors.New("the command's stdin is closed")
)

// errFileConflicts are the file refusals answered 409 file-conflict, with
// the title of each.
var errFileConflicts = map[error]string{
	errFileExists:       "File exists",
	errFileNotDir:       "Not a directory",
	errFileIsDir:        "Is a directory",
	errFileNotEmpty:     "Directory not empty",
	errFileSymlink:      "Symbolic link in the way",
	errFileMoveIntoSelf: "Cannot move a directory under itself",
	errFilesFull:        "Session files full",
}

// refusal is a domain error and what its answer tells the client: one of
// the sentinels above (errors.Is finds it, and its cause), the detail
// saying what to do, and the input, bound, delay and job it is about.
type refusal struct {
	kind   error  // a sentinel above
	detail string // "" for kind's usual wording
	// field is the JSON path (or header) of the input at fault.
	field string
	// limit is the bound that was passed.
	limit int64
	// quota is which of the tenant's quotas (errQuotaExceeded).
	quota job.Quota
	// retryAfter is when to try again; 0 means the server's delay for kind.
	retryAfter time.Duration
	// recorded names the job whose record exists though its publish was
	// refused or unconfirmed: it will be queued (the reconciler, or a retry
	// with the same Idempotency-Key).
	recorded string
	cause    error
}

func (r *refusal) Error() string {
	msg := r.kind.Error()
	if r.detail != "" {
		msg += ": " + r.detail
	}
	if r.cause != nil {
		msg += ": " + r.cause.Error()
	}
	return msg
}

func (r *refusal) Unwrap() []error {
	if r.cause == nil {
		return []error{r.kind}
	}
	return []error{r.kind, r.cause}
}
