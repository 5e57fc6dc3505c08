package audit

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Defaults of a tenant's audit bounds (key file: audit_records_per_day,
// audit_bytes_per_day).
const (
	RecordsPerDayDefault = 100_000
	BytesPerDayDefault   = 64 << 20
)

// Counter counts what a tenant appends to its audit log each UTC day
// (*cache.Store).
type Counter interface {
	ReserveAudit(ctx context.Context, tenant string, records, bytes, maxRecords, maxBytes int64, now time.Time) (cache.AuditAdmission, error)
}

// Bound is a tenant's audit bounds per UTC day; zero fields take the
// defaults (RecordsPerDayDefault, BytesPerDayDefault).
type Bound struct {
	RecordsPerDay, BytesPerDay int64
}

func (b Bound) withDefaults() Bound {
	if b.RecordsPerDay <= 0 {
		b.RecordsPerDay = RecordsPerDayDefault
	}
	if b.BytesPerDay <= 0 {
		b.BytesPerDay = BytesPerDayDefault
	}
	return b
}

// BoundOf is the audit bound a job's message carries (nil: the defaults).
func BoundOf(q *job.TenantQuota) Bound {
	if q == nil {
		return Bound{}
	}
	return Bound{RecordsPerDay: q.AuditRecordsPerDay, BytesPerDay: q.AuditBytesPerDay}
}

// Admit returns how many of recs (the first ones) tenant may append today
// within b, and, when they reached the bound for the first time today, the
// record saying so (kind job.AuditBoundReached), to append beside them
// whatever the bound: so a tenant at its bound leaves one record a day of
// it, and adds nothing else to the stream every tenant's records share.
// A counter that cannot answer admits every record: the log is never
// short for want of the counter (the failure is logged).
func Admit(ctx context.Context, c Counter, log *slog.Logger, tenant string, b Bound, recs []job.AuditRecord, now time.Time) (kept int, reached *job.AuditRecord) {
	if len(recs) == 0 || c == nil {
		return len(recs), nil
	}
	b = b.withDefaults()
	var size int64
	for _, r := range recs {
		if enc, err := appendRecord(nil, r); err == nil {
			size += int64(len(enc))
		}
	}
	a, err := c.ReserveAudit(ctx, tenant, int64(len(recs)), size, b.RecordsPerDay, b.BytesPerDay, now)
	if err != nil {
		log.WarnContext(ctx, "count the tenant's audit records; appending them unbounded", slog.String("tenant", tenant), slog.Any("error", err))
		return len(recs), nil
	}
	if !a.First {
		return int(a.Kept), nil
	}
	q, limit := job.QuotaAuditBytesPerDay, b.BytesPerDay
	if a.Records+a.Kept >= b.RecordsPerDay {
		q, limit = job.QuotaAuditRecordsPerDay, b.RecordsPerDay
	}
	return int(a.Kept), &job.AuditRecord{Time: now.UTC(), Kind: job.AuditBoundReached,
		Detail: fmt.Sprintf("%s=%d reached: the tenant's further records today (UTC) are not kept", q, limit)}
}
