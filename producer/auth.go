package producer

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"sort"
	"strings"

	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/job"
)

// apiKeys are the configured API keys, by tenant name; none is dev mode,
// where every request is job.DefaultTenant's.
type apiKeys []apiKey

type apiKey struct {
	sum  [sha256.Size]byte
	name string
	// auditID names the key in audit records (audit.KeyID), made once
	// rather than hashed again for every request.
	auditID string
}

// newAPIKeys keeps the sums of keys (Config.APIKeys: key → tenant), sorted
// by tenant.
func newAPIKeys(keys map[string]string) apiKeys {
	var out apiKeys
	for k, name := range keys {
		out = append(out, apiKey{sum: sha256.Sum256([]byte(k)), name: name, auditID: audit.KeyID(k)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// authed checks the bearer key (unless in dev mode) and passes the key's
// name to h as the caller.
func (keys apiKeys) authed(h func(w http.ResponseWriter, r *http.Request, caller string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if len(keys) == 0 {
			h(w, r, job.DefaultTenant) // dev mode: the one tenant
			return
		}
		caller, auditID, p := keys.authenticate(r)
		if p != nil {
			writeProblem(w, p)
			return
		}
		h(w, withAuditKey(r, auditID), caller)
	}
}

// authenticate compares the presented key with every configured key in
// constant time (over SHA-256 sums, so lengths leak nothing either), and
// returns its tenant and its name in audit records. The key comes in the
// Authorization header or, for a read (GET, HEAD) only, in the run page's
// cookie (ui.go): a cookie never authorizes a change, so no other site can
// make a browser submit, cancel or delete with it.
func (keys apiKeys) authenticate(r *http.Request) (tenant, auditID string, p *problem) {
	auth := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(auth, " ")
	if auth == "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		if c, err := r.Cookie(uiKeyCookie); err == nil && c.Value != "" {
			scheme, token, ok = "Bearer", c.Value, true
		}
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", "", newProblem(http.StatusUnauthorized, job.ProblemUnauthorized, "API key required",
			"send your API key as \"Authorization: Bearer <key>\"")
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	found := 0
	for i := range keys {
		if subtle.ConstantTimeCompare(sum[:], keys[i].sum[:]) == 1 {
			tenant, auditID, found = keys[i].name, keys[i].auditID, 1
		}
	}
	if found == 0 {
		return "", "", newProblem(http.StatusUnauthorized, job.ProblemUnauthorized, "Invalid API key",
			"the API key in the Authorization header is not valid; check it, or ask an operator for one")
	}
	return tenant, auditID, nil
}
