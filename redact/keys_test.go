package redact

import (
	"math/rand/v2"
	"strings"
)

// Fake keys in the shapes of real ones, made at test time so that no file
// of the repository holds anything a secret scanner would flag.
type sample struct {
	kind, key string
	// line is how the key appears in output; "%s" is the key.
	line string
}

func randFrom(r *rand.Rand, alphabet string, n int) string {
	var b strings.Builder
	for range n {
		b.WriteByte(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

const (
	azAZ09  = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	upper09 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	urlSafe = azAZ09 + "_-"
)

// mixedKey is a random key of n bytes with a digit, an upper- and a
// lower-case letter, as real random keys have.
func mixedKey(r *rand.Rand, alphabet string, n int) string {
	for {
		k := randFrom(r, alphabet, n)
		if mixed([]byte(k)) {
			return k
		}
	}
}

func samples(seed uint64) []sample {
	r := rand.New(rand.NewPCG(seed, 26))
	pem := "-----BEGIN " + "RSA PRIVATE KEY-----\n"
	for range 12 {
		pem += randFrom(r, azAZ09+"+/", 64) + "\n"
	}
	pem += "-----END " + "RSA PRIVATE KEY-----"
	jwt := "eyJ" + "hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJ" + randFrom(r, urlSafe, 60) + "." + randFrom(r, urlSafe, 43)
	return []sample{
		{KindAWSAccessKey, "AKIA" + randFrom(r, upper09, 16), "AWS_ACCESS_KEY_ID=%s\n"},
		{KindAWSSecretKey, randFrom(r, azAZ09+"+/", 40), "aws_secret_access_key = %s\n"},
		{KindGitHubToken, "ghp_" + randFrom(r, azAZ09, 36), "git clone https://x-access-token:%s@github.com/o/r\n"},
		{KindGitHubToken, "github_pat_" + randFrom(r, azAZ09, 22) + "_" + randFrom(r, azAZ09, 59), "token: %s\n"},
		{KindGitLabToken, "glpat-" + randFrom(r, urlSafe, 20), "GITLAB_TOKEN='%s'\n"},
		{KindSlackToken, "xoxb-" + randFrom(r, "0123456789", 12) + "-" + randFrom(r, "0123456789", 13) + "-" + randFrom(r, azAZ09, 24), "{\"token\": \"%s\"}\n"},
		{KindSlackWebhook, "hooks.slack.com/services/T" + randFrom(r, upper09, 8) + "/B" + randFrom(r, upper09, 8) + "/" + randFrom(r, azAZ09, 24), "post to https://%s now\n"},
		{KindStripeKey, "sk_live_" + randFrom(r, azAZ09, 24), "stripe.api_key = \"%s\"\n"},
		{KindOpenAIKey, "sk-proj-" + mixedKey(r, urlSafe, 100), "OPENAI_API_KEY=%s\n"},
		{KindAnthropicKey, "sk-ant-api03-" + randFrom(r, urlSafe, 93) + "AA", "client = Anthropic(api_key='%s')\n"},
		{KindGoogleAPIKey, "AIza" + randFrom(r, urlSafe, 35), "https://maps.googleapis.com/api?key=%s&q=1\n"},
		{KindNPMToken, "npm_" + randFrom(r, azAZ09, 36), "//registry.npmjs.org/:_authToken=%s\n"},
		{KindHuggingFace, "hf_" + mixedKey(r, azAZ09, 34), "HF_TOKEN=%s\n"},
		{KindSendGridKey, "SG." + randFrom(r, urlSafe, 22) + "." + randFrom(r, urlSafe, 43), "sg key %s\n"},
		{KindJWT, jwt, "session=%s; Path=/\n"},
		{KindPrivateKey, pem, "%s\n"},
		{KindAuthorization, "Basic " + randFrom(r, azAZ09, 24) + "==", "Authorization: %s\r\n"},
		{KindBearer, mixedKey(r, azAZ09+"._-", 40), "curl -H 'X-Token: none' sent Bearer %s ok\n"},
		{KindURLPassword, "s3cr3t-" + randFrom(r, azAZ09, 10), "DATABASE_URL=postgres://app:%s@db:5432/app\n"},
	}
}
