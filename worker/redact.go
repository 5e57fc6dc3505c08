package worker

import (
	"context"
	"log/slog"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

// detector returns the redaction detector of a run's tenant policy. A policy
// the worker cannot use (the API checks it when it reads the key file, so
// only a bug gets here) falls back to the built-in detectors: output is
// never left unredacted because of it.
func detector(ctx context.Context, log *slog.Logger, policy *job.RedactPolicy) *redact.Detector {
	d, err := redact.New(policy)
	if err != nil {
		log.ErrorContext(ctx, "the job's redaction policy is unusable; redacting with the built-in detectors only", slog.Any("error", err))
		d, _ = redact.New(nil)
	}
	return d
}
