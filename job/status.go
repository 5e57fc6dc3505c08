package job

// Status is where a job is in its life. Terminal statuses never change once written.
type Status string

const (
	StatusQueued        Status = "queued"
	StatusRunning       Status = "running"
	StatusSucceeded     Status = "succeeded"
	StatusFailed        Status = "failed"
	StatusTimedOut      Status = "timed_out"
	StatusOOMKilled     Status = "oom_killed"
	StatusCanceled      Status = "canceled"
	StatusInternalError Status = "internal_error"
)

// Terminal reports whether s is a final status.
func (s Status) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusTimedOut, StatusOOMKilled, StatusCanceled, StatusInternalError:
		return true
	}
	return false
}

// Statuses lists every status, in life order.
var Statuses = []Status{StatusQueued, StatusRunning, StatusSucceeded, StatusFailed, StatusTimedOut, StatusOOMKilled, StatusCanceled, StatusInternalError}

// Category is the machine-readable reason a job failed.
type Category string

const (
	CategorySyntaxError    Category = "syntax_error"
	CategoryRuntimeError   Category = "runtime_error"
	CategoryTimeout        Category = "timeout"
	CategoryMemoryLimit    Category = "memory_limit"
	CategoryOutputLimit    Category = "output_limit"
	CategoryForbidden      Category = "forbidden"
	CategoryInvalidRequest Category = "invalid_request"
	CategoryCanceled       Category = "canceled"
	CategoryInternal       Category = "internal"
	// CategoryQuota: a quota or bound of the job's tenant (named in the
	// message, e.g. cpu_seconds_per_day) did not let the job run or keep
	// its output. Running it again does not help until the quota renews.
	CategoryQuota Category = "quota_exceeded"
)

// Retryable reports whether running the same job again may give a different
// outcome without changing it: true only for faults of the platform, not of the code.
func (c Category) Retryable() bool { return c == CategoryInternal }

// Failure is the error part of a Result.
type Failure struct {
	Category  Category `json:"category" redact:"platform"`
	Message   string   `json:"message"`
	Retryable bool     `json:"retryable"`
	// Exception is the program's uncaught exception or syntax error, for
	// runtime_error and syntax_error failures whose launcher reported one.
	Exception *Exception `json:"exception,omitempty"`
}

// NewFailure builds a Failure whose Retryable follows the category.
func NewFailure(c Category, msg string) *Failure {
	return &Failure{Category: c, Message: msg, Retryable: c.Retryable()}
}
