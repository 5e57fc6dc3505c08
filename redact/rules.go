package redact

import (
	"bytes"
	"slices"
)

// Kinds of the built-in detectors, as Result.Redactions counts them.
const (
	KindAWSAccessKey  = "aws_access_key"
	KindAWSSecretKey  = "aws_secret_key"
	KindGitHubToken   = "github_token"
	KindGitLabToken   = "gitlab_token"
	KindSlackToken    = "slack_token"
	KindSlackWebhook  = "slack_webhook"
	KindStripeKey     = "stripe_key"
	KindOpenAIKey     = "openai_key"
	KindAnthropicKey  = "anthropic_key"
	KindGoogleAPIKey  = "google_api_key"
	KindNPMToken      = "npm_token"
	KindPyPIToken     = "pypi_token"
	KindHuggingFace   = "huggingface_token"
	KindSendGridKey   = "sendgrid_key"
	KindJWT           = "jwt"
	KindPrivateKey    = "private_key"
	KindAuthorization = "authorization"
	KindBearer        = "bearer_token"
	KindURLPassword   = "url_password"
	KindSecret        = "secret"     // a tenant's registered secret
	KindPatternPrefix = "pattern:"   // + a tenant pattern's name
	KindAssignment    = "assignment" // strict mode: password=..., api_key: ...
	maxTokenLen       = 512          // longest token a prefix rule takes
	maxPEMLen         = 16 << 10     // longest PEM block looked for
	maxHeaderValueLen = 8 << 10      // longest Authorization value
)

// byte classes
type class [256]bool

func newClass(ranges ...string) *class {
	var c class
	for _, r := range ranges {
		if len(r) == 3 && r[1] == '-' {
			for b := int(r[0]); b <= int(r[2]); b++ {
				c[b] = true
			}
			continue
		}
		for i := 0; i < len(r); i++ {
			c[r[i]] = true
		}
	}
	return &c
}

var (
	upperDigit = newClass("A-Z", "0-9")
	alnum      = newClass("A-Z", "a-z", "0-9")
	alnumU     = newClass("A-Z", "a-z", "0-9", "_")
	b64url     = newClass("A-Z", "a-z", "0-9", "_", "-")
	alnumDash  = newClass("A-Z", "a-z", "0-9", "-")
	b64std     = newClass("A-Z", "a-z", "0-9", "+", "/", "=")
	webhook    = newClass("A-Z", "a-z", "0-9", "/", "_")
	bearerTok  = newClass("A-Z", "a-z", "0-9", ".", "_", "~", "+", "/", "=", "-")
	// tokenChar: a byte a key may be glued to on its left. A prefix rule
	// matches only where the byte before is none of these, so "AKIA" inside
	// base64 data or "sk-" inside "task-" is not a key. "/" and "-" are not:
	// keys show up in paths and names ("/work/out/dump-AKIA..."), and the
	// prefixes base64 data can hold after them are followed by a run of key
	// bytes too long or too short for a key all but always (the corpus
	// test).
	tokenChar = newClass("A-Z", "a-z", "0-9", "+", "_")
	space     = newClass(" ", "\t")
)

// run returns how many bytes of b from i on are in c, counting at most limit+1.
func run(b []byte, i int, c *class, limit int) int {
	n := 0
	for i+n < len(b) && c[b[i+n]] && n <= limit {
		n++
	}
	return n
}

// mixed reports whether t has a digit, an upper- and a lower-case letter:
// random keys do, words and hyphenated names rarely do.
func mixed(t []byte) bool {
	var d, u, l bool
	for _, c := range t {
		switch {
		case '0' <= c && c <= '9':
			d = true
		case 'A' <= c && c <= 'Z':
			u = true
		case 'a' <= c && c <= 'z':
			l = true
		}
	}
	return d && u && l
}

func hasPrefixFold(b []byte, p string) bool {
	if len(b) < len(p) {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != p[i] {
			return false
		}
	}
	return true
}

// rule is one built-in detector. match is called at i when b[i] is one of
// first and the token boundary holds; it returns the span to replace
// (which may lie after i, as the value of a header does), or ok false.
type rule struct {
	kind  string
	first string
	// glued: the rule may match right after a token character (its anchor
	// is punctuation, as in "-----BEGIN" or "://").
	glued bool
	match func(b []byte, i int) (start, end int, ok bool)
}

// prefixRule matches one of prefixes followed by a body of n bytes of c,
// min <= n <= max, not followed by a further alphanumeric byte.
func prefixRule(kind string, prefixes []string, c *class, min, max int, needMixed bool) rule {
	first := ""
	for _, p := range prefixes {
		if !bytes.Contains([]byte(first), []byte{p[0]}) {
			first += p[:1]
		}
	}
	return rule{kind: kind, first: first, match: func(b []byte, i int) (int, int, bool) {
		for _, p := range prefixes {
			if !bytes.HasPrefix(b[i:], []byte(p)) {
				continue
			}
			j := i + len(p)
			n := run(b, j, c, max)
			if n < min || n > max {
				continue
			}
			if e := j + n; e < len(b) && alnum[b[e]] {
				continue
			}
			if needMixed && !mixed(b[j:j+n]) {
				continue
			}
			return i, j + n, true
		}
		return 0, 0, false
	}}
}

func glue(r rule) rule {
	r.glued = true
	return r
}

// prefixRules are the detectors of keys known by their prefix.
var prefixRules = []rule{
	prefixRule(KindAWSAccessKey, []string{"AKIA", "ASIA", "ABIA", "ACCA"}, upperDigit, 16, 16, false),
	prefixRule(KindGitHubToken, []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_"}, alnum, 36, 251, false),
	prefixRule(KindGitHubToken, []string{"github_pat_"}, alnumU, 50, 255, false),
	prefixRule(KindGitLabToken, []string{"glpat-", "gldt-", "glrt-", "glptt-", "glft-", "glsoat-", "glcbt-", "gloas-"}, b64url, 20, 255, false),
	prefixRule(KindSlackToken, []string{"xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "xoxe-", "xoxe.xoxp-", "xapp-"}, alnumDash, 10, 255, false),
	glue(prefixRule(KindSlackWebhook, []string{"hooks.slack.com/services/", "hooks.slack.com/workflows/"}, webhook, 20, 255, false)),
	prefixRule(KindStripeKey, []string{"sk_live_", "rk_live_", "sk_test_", "rk_test_", "whsec_"}, alnum, 20, 255, false),
	prefixRule(KindAnthropicKey, []string{"sk-ant-"}, b64url, 32, 255, false),
	prefixRule(KindOpenAIKey, []string{"sk-proj-", "sk-svcacct-", "sk-admin-", "sk-"}, b64url, 20, 255, true),
	prefixRule(KindGoogleAPIKey, []string{"AIza"}, b64url, 35, 35, false),
	prefixRule(KindNPMToken, []string{"npm_"}, alnum, 36, 36, false),
	prefixRule(KindPyPIToken, []string{"pypi-AgEIcHlwaS5vcmc"}, b64url, 50, 255, false),
	prefixRule(KindHuggingFace, []string{"hf_"}, alnum, 30, 40, true),
}

// builtins are the detectors of RedactOn, in the order tried at one byte.
var builtins = append(slices.Clip(prefixRules), []rule{
	{kind: KindSendGridKey, first: "S", match: matchSendGrid},
	{kind: KindJWT, first: "e", match: matchJWT},
	{kind: KindPrivateKey, first: "-", glued: true, match: matchPEM},
	{kind: KindAWSSecretKey, first: "aA", match: matchAWSSecret},
	{kind: KindAuthorization, first: "aA", match: matchAuthorization},
	{kind: KindBearer, first: "bB", match: matchBearer},
	{kind: KindURLPassword, first: ":", glued: true, match: matchURLPassword},
}...)

// matchSendGrid: SG.<22 base64url>.<43 base64url>.
func matchSendGrid(b []byte, i int) (int, int, bool) {
	if !bytes.HasPrefix(b[i:], []byte("SG.")) {
		return 0, 0, false
	}
	j := i + 3
	if n := run(b, j, b64url, 22); n != 22 || j+n >= len(b) || b[j+n] != '.' {
		return 0, 0, false
	}
	j += 23
	if n := run(b, j, b64url, 43); n != 43 {
		return 0, 0, false
	}
	return i, j + 43, true
}

// matchJWT: header.payload.signature, both JSON parts base64url starting
// "eyJ" (`{"`); the signature may be empty (alg none).
func matchJWT(b []byte, i int) (int, int, bool) {
	j := i
	for part := 0; part < 2; part++ {
		if !bytes.HasPrefix(b[j:], []byte("eyJ")) {
			return 0, 0, false
		}
		n := run(b, j, b64url, maxHeaderValueLen)
		if n < 10 || n > maxHeaderValueLen || j+n >= len(b) || b[j+n] != '.' {
			return 0, 0, false
		}
		j += n + 1
	}
	n := run(b, j, b64url, maxHeaderValueLen)
	if n > maxHeaderValueLen {
		return 0, 0, false
	}
	return i, j + n, true
}

// matchPEM: a "-----BEGIN ... PRIVATE KEY-----" block through its END line;
// without one (yet), through the base64 and blank space that follow, so a
// stream holds it until it ends.
func matchPEM(b []byte, i int) (int, int, bool) {
	const begin = "-----BEGIN "
	if !bytes.HasPrefix(b[i:], []byte(begin)) {
		return 0, 0, false
	}
	j := i + len(begin)
	lab := run(b, j, newLabel, 64)
	if lab > 64 || !bytes.HasPrefix(b[j+lab:], []byte("-----")) || !bytes.Contains(b[j:j+lab], []byte("PRIVATE KEY")) {
		return 0, 0, false
	}
	j += lab + 5
	rest := b[j:min(len(b), j+maxPEMLen)]
	if k := bytes.Index(rest, []byte("-----END ")); k >= 0 {
		e := j + k + len("-----END ")
		e += run(b, e, newLabel, 64)
		if bytes.HasPrefix(b[e:], []byte("-----")) {
			e += 5
		}
		return i, e, true
	}
	return i, j + run(b, j, pemBody, maxPEMLen), true
}

var (
	newLabel = newClass("A-Z", "0-9", " ")
	pemBody  = newClass("A-Z", "a-z", "0-9", "+", "/", "=", " ", "\t", "\r", "\n", ":", ",", "-")
)

// matchAWSSecret: aws_secret_access_key = <40 base64 bytes>, in any case.
func matchAWSSecret(b []byte, i int) (int, int, bool) {
	const kw = "aws_secret_access_key"
	if !hasPrefixFold(b[i:], kw) {
		return 0, 0, false
	}
	j := i + len(kw)
	j += run(b, j, sepChars, 8)
	if n := run(b, j, b64std, 40); n != 40 {
		return 0, 0, false
	}
	return j, j + 40, true
}

var sepChars = newClass(" ", "\t", "\"", "'", ":", "=")

// matchAuthorization: the value of an Authorization header (or a key named
// so in JSON or code) to the end of its line or closing quote, when its
// first word after an optional scheme is at least 8 bytes long.
func matchAuthorization(b []byte, i int) (int, int, bool) {
	const kw = "authorization"
	if !hasPrefixFold(b[i:], kw) {
		return 0, 0, false
	}
	j := i + len(kw)
	var quote byte
	for j < len(b) && (b[j] == '"' || b[j] == '\'') {
		j++
	}
	j += run(b, j, space, 8)
	if j >= len(b) || (b[j] != ':' && b[j] != '=') {
		return 0, 0, false
	}
	j++
	for j < len(b) && sepChars[b[j]] && b[j] != ':' && b[j] != '=' {
		if b[j] == '"' || b[j] == '\'' {
			quote = b[j]
		}
		j++
	}
	start := j
	e := j
	for e < len(b) && e-start < maxHeaderValueLen && b[e] != '\n' && b[e] != '\r' && (quote == 0 || b[e] != quote) {
		e++
	}
	v := b[start:e]
	first, rest, _ := bytes.Cut(v, []byte(" "))
	if !credential(first) {
		if w, _, _ := bytes.Cut(bytes.TrimLeft(rest, " "), []byte(" ")); !credential(w) {
			return 0, 0, false
		}
	}
	return start, e, true
}

// credential reports whether w looks like a credential rather than a
// word: 8 bytes or more, with a digit or one of base64's and tokens'
// punctuation.
func credential(w []byte) bool {
	return len(w) >= 8 && bytes.ContainsAny(w, "0123456789=+/._-")
}

// matchBearer: "Bearer <token>" outside an Authorization header.
func matchBearer(b []byte, i int) (int, int, bool) {
	if !hasPrefixFold(b[i:], "bearer ") {
		return 0, 0, false
	}
	j := i + len("bearer ")
	n := run(b, j, bearerTok, maxHeaderValueLen)
	if n < 16 || n > maxHeaderValueLen || !mixed(b[j:j+n]) {
		return 0, 0, false
	}
	return j, j + n, true
}

// matchURLPassword: the password of scheme://user:password@host.
func matchURLPassword(b []byte, i int) (int, int, bool) {
	if !bytes.HasPrefix(b[i:], []byte("://")) || i == 0 || !alnum[b[i-1]] {
		return 0, 0, false
	}
	j := i + 3
	u := run(b, j, userChar, 256)
	if u == 0 || u > 256 || j+u >= len(b) || b[j+u] != ':' {
		return 0, 0, false
	}
	j += u + 1
	p := run(b, j, passChar, 256)
	if p == 0 || p > 256 || j+p >= len(b) || b[j+p] != '@' || isKey(b, j) {
		// A key used as the password is counted as what it is, at j.
		return 0, 0, false
	}
	return j, j + p, true
}

// isKey reports whether a prefix rule's key starts at b[i].
func isKey(b []byte, i int) bool {
	for _, r := range prefixRules {
		if _, _, ok := r.match(b, i); ok {
			return true
		}
	}
	return false
}

var (
	userChar = notClass("/ \t\r\n:@\"'<>")
	passChar = notClass("/ \t\r\n@\"'<>")
)

func notClass(s string) *class {
	var c class
	for i := range c {
		c[i] = true
	}
	c[0] = false
	for i := 0; i < len(s); i++ {
		c[s[i]] = false
	}
	return &c
}

// strictRules are added in RedactStrict.
var strictRules = []rule{{kind: KindAssignment, first: "pPsStTaAcC", glued: true, match: matchAssignment}}

var assignmentKeywords = []string{"password", "passwd", "pwd", "secret", "token", "api_key", "apikey", "api-key",
	"access_key", "accesskey", "private_key", "client_secret", "credential"}

var (
	nameChar  = newClass("A-Z", "a-z", "0-9", "_", "-")
	valueChar = notClass(" \t\r\n\"',;")
)

// matchAssignment: the value of a setting whose name says it is secret
// (db_password = ..., "api_key": "...", GITHUB_TOKEN=...).
func matchAssignment(b []byte, i int) (int, int, bool) {
	for _, kw := range assignmentKeywords {
		if !hasPrefixFold(b[i:], kw) {
			continue
		}
		j := i + len(kw)
		j += run(b, j, nameChar, 32)
		for j < len(b) && (b[j] == '"' || b[j] == '\'') {
			j++
		}
		j += run(b, j, space, 8)
		if j >= len(b) || (b[j] != ':' && b[j] != '=') {
			return 0, 0, false
		}
		j++
		for j < len(b) && (space[b[j]] || b[j] == '"' || b[j] == '\'') {
			j++
		}
		n := run(b, j, valueChar, maxTokenLen)
		if n < 6 || n > maxTokenLen {
			return 0, 0, false
		}
		return j, j + n, true
	}
	return 0, 0, false
}

// Kinds lists the kinds a Result's redactions may count, but for
// KindPatternPrefix + a tenant pattern's name: the built-in detectors',
// KindSecret and KindAssignment.
func Kinds() []string {
	var out []string
	for _, r := range append(slices.Clip(builtins), strictRules...) {
		if !slices.Contains(out, r.kind) {
			out = append(out, r.kind)
		}
	}
	return append(out, KindSecret)
}
