package job

import "fmt"

// InvalidError says which field of a spec is wrong and how to fix it.
// Producers turn it into HTTP 400/422; the sandbox into an invalid_request result.
type InvalidError struct {
	Field   string // JSON path of the offending field, e.g. "limits.memory_mb"
	Message string // what is wrong and what to send instead
}

func (e *InvalidError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Message) }

func invalid(field, msg string) error { return &InvalidError{Field: field, Message: msg} }
