package job

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Callback names shared by the API, the workers and the deliverer.
const (
	// CallbackStreamName is the JetStream stream of callbacks waiting to be delivered.
	CallbackStreamName = "KILN_CALLBACKS"
	// CallbackSubjectPrefix + job id is where a job's callback request is published.
	CallbackSubjectPrefix = "kiln.callbacks."
	// HeaderSignature carries a callback's signature: "t=<unix seconds>,v1=<hex HMAC-SHA256>".
	HeaderSignature = "Kiln-Signature"
	// HeaderDeliveryAttempt is the callback's delivery attempt, from 1.
	HeaderDeliveryAttempt = "Kiln-Delivery-Attempt"
	// MaxCallbackURLLen bounds callback_url.
	MaxCallbackURLLen = 2048
)

// CallbackSubject returns the subject a job's callback request was
// published on before callbacks had a subject per tenant; deliverers still
// serve it.
func CallbackSubject(id string) string { return CallbackSubjectPrefix + id }

// CallbackTenantPrefix + tenant token is where a tenant's callback requests
// are published (TenantCallbackSubject).
const CallbackTenantPrefix = CallbackSubjectPrefix + "t."

// TenantCallbackSubject is where tenant's callback requests are published:
// "kiln.callbacks.t.<tenant token>", so each tenant's callbacks wait in a
// consumer of their own and one tenant's backlog never holds up another's.
func TenantCallbackSubject(tenant string) string { return CallbackTenantPrefix + TenantToken(tenant) }

// CallbackRequest is the JetStream message asking for a job's callback: the
// job has ended, its Result is in its record. Published with Nats-Msg-Id
// "callback-<id>", so a job's callback is queued once however often it is asked.
type CallbackRequest struct {
	ID      string    `json:"id"`
	URL     string    `json:"url"`
	Tenant  string    `json:"tenant,omitempty"`
	EndedAt time.Time `json:"ended_at"`
}

// CallbackDelivery is where a job's callback stands (GET /v1/jobs/{id} → "callback").
type CallbackDelivery string

const (
	CallbackPending   CallbackDelivery = "pending"   // not delivered yet; being tried
	CallbackDelivered CallbackDelivery = "delivered" // the receiver answered 2xx
	CallbackFailed    CallbackDelivery = "failed"    // given up: a 3xx/4xx answer, a refused address, or retries ran out
)

// CallbackState is a job's callback delivery state.
type CallbackState struct {
	URL      string           `json:"url"`
	State    CallbackDelivery `json:"state"`
	Attempts int              `json:"attempts"`
	// LastStatus is the HTTP status of the latest attempt (0: no answer).
	LastStatus int `json:"last_status,omitempty"`
	// LastError says why the latest attempt did not deliver.
	LastError     string     `json:"last_error,omitempty"`
	LastAttemptAt *time.Time `json:"last_attempt_at,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	DeliveredAt   *time.Time `json:"delivered_at,omitempty"`
}

// validateCallbackURL checks callback_url's form; which addresses it may
// reach is the server's policy (package callback), checked at submission and
// again at every delivery.
func validateCallbackURL(raw string) error {
	if raw == "" {
		return nil
	}
	const field = "callback_url"
	if len(raw) > MaxCallbackURLLen {
		return invalid(field, fmt.Sprintf("callback_url is %d bytes; the maximum is %d", len(raw), MaxCallbackURLLen))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return invalid(field, fmt.Sprintf("callback_url is not a URL: %v", err))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return invalid(field, fmt.Sprintf("callback_url scheme %q is not allowed; use https:// (or http://)", u.Scheme))
	case u.Host == "" || u.Hostname() == "":
		return invalid(field, "callback_url has no host; send an absolute URL such as https://example.com/kiln")
	case u.User != nil:
		return invalid(field, "callback_url must not carry credentials (user:password@); verify the Kiln-Signature header instead")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return invalid(field, "callback_url must not have a #fragment")
	}
	return nil
}
