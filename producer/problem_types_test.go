package producer

import (
	"testing"

	"github.com/kilnrun/kiln/job"
)

// The API's problem types are the ones job/ publishes to clients.
func TestProblemTypesMatchTheWireContract(t *testing.T) {
	t.Parallel()
	pairs := map[string]job.ProblemType{
		typeMalformedJSON:     job.ProblemMalformedJSON,
		typeUnknownField:      job.ProblemUnknownField,
		typeUnsupportedMedia:  job.ProblemUnsupportedMediaType,
		typeBodyTooLarge:      job.ProblemBodyTooLarge,
		typeInvalidField:      job.ProblemInvalidField,
		typeBatchTooLarge:     job.ProblemBatchTooLarge,
		typeInvalidParameter:  job.ProblemInvalidParameter,
		typeInvalidID:         job.ProblemInvalidID,
		typeNotFound:          job.ProblemNotFound,
		typeMethodNotAllowed:  job.ProblemMethodNotAllowed,
		typeIdempotencyReused: job.ProblemIdempotencyKeyReused,
		typeUnauthorized:      job.ProblemUnauthorized,
		typeQueueFull:         job.ProblemQueueFull,
		typeUnavailable:       job.ProblemUnavailable,
		typeInternal:          job.ProblemInternal,
	}
	for got, want := range pairs {
		if got != string(want) {
			t.Errorf("producer answers %q where job/ says %q", got, want)
		}
	}
}
