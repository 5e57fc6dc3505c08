package redact

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

func mustNew(t testing.TB, p *job.RedactPolicy) *Detector {
	t.Helper()
	d, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDetectsEachKind(t *testing.T) {
	t.Parallel()
	d := mustNew(t, nil)
	for _, s := range samples(1) {
		t.Run(s.kind, func(t *testing.T) {
			in := fmt.Sprintf(s.line, s.key)
			out, c := d.String(in)
			if strings.Contains(out, s.key) {
				t.Fatalf("key kept:\n%s", out)
			}
			if c[s.kind] != 1 || len(c) != 1 {
				t.Fatalf("counts %v, want one %s", c, s.kind)
			}
			if !strings.Contains(out, Replacement(s.kind)) {
				t.Fatalf("no replacement in %q", out)
			}
			// The text around the key stays.
			before, _, _ := strings.Cut(s.line, "%s")
			if !strings.HasPrefix(out, before) {
				t.Fatalf("context lost: %q", out)
			}
		})
	}
}

func TestKeepsLookalikes(t *testing.T) {
	t.Parallel()
	d := mustNew(t, nil)
	for _, in := range []string{
		"task-manager-for-the-whole-production-fleet",              // "sk-" inside a word
		"sk-learn-is-a-python-library-for-machine-learning",        // no digits or capitals
		"b64: Zm9vAKIAIOSFODNN7EXAMPLEYmFyYmF6",                    // AKIA glued to base64
		"AKIAIOSFODNN7EXAMPLE1",                                    // too long for an access key
		"Authorization: required",                                  // no credential
		"authorization = you need one",                             // prose
		"the bearer of bad news, bearer bonds",                     // prose
		"http://localhost:8080/path and ftp://host:21/",            // ports, not passwords
		"eyJhbGciOiJIUzI1NiJ9 is base64 of a JSON header",          // one JSON part only
		"-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAA\n", // public
		"ghp_short",
	} {
		if out, c := d.String(in); c != nil {
			t.Errorf("%q redacted as %v: %q", in, c, out)
		}
	}
}

func TestOffModeKeepsEverything(t *testing.T) {
	t.Parallel()
	d := mustNew(t, &job.RedactPolicy{Mode: job.RedactOff})
	for _, s := range samples(2) {
		in := fmt.Sprintf(s.line, s.key)
		if out, c := d.String(in); out != in || c != nil {
			t.Fatalf("off mode changed %q to %q (%v)", in, out, c)
		}
	}
}

func TestStrictModeRedactsAssignments(t *testing.T) {
	t.Parallel()
	in := "db_password = hunter2hunter2\nAPI_KEY: 'abc123def456'\nname = alice\n"
	on, c := mustNew(t, nil).String(in)
	if c != nil {
		t.Fatalf("on mode redacted plain assignments: %q", on)
	}
	out, c := mustNew(t, &job.RedactPolicy{Mode: job.RedactStrict}).String(in)
	if c[KindAssignment] != 2 || strings.Contains(out, "hunter2") || strings.Contains(out, "abc123def456") || !strings.Contains(out, "name = alice") {
		t.Fatalf("strict: %v %q", c, out)
	}
}

func TestRegisteredSecretsAndPatterns(t *testing.T) {
	t.Parallel()
	fp, err := Fingerprint("corp-internal-passphrase")
	if err != nil {
		t.Fatal(err)
	}
	fp2, err := Fingerprint("another one!")
	if err != nil {
		t.Fatal(err)
	}
	d := mustNew(t, &job.RedactPolicy{Secrets: []job.SecretPrint{fp, fp2},
		Patterns: []job.RedactPattern{{Name: "employee", Regexp: `EMP-[0-9]{6}`}}})
	in := "a corp-internal-passphrase b corp-internal-passphrasX another one! EMP-123456 EMP-12"
	out, c := d.String(in)
	want := "a [REDACTED:secret] b corp-internal-passphrasX [REDACTED:secret] [REDACTED:pattern:employee] EMP-12"
	if out != want || c[KindSecret] != 2 || c["pattern:employee"] != 1 {
		t.Fatalf("got %q %v\nwant %q", out, c, want)
	}
	if _, err := Fingerprint("short"); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
	if _, err := New(&job.RedactPolicy{Patterns: []job.RedactPattern{{Name: "x", Regexp: `a*`}}}); err == nil {
		t.Fatal("a pattern matching the empty string was accepted")
	}
}

func TestUnknownModeIsAnError(t *testing.T) {
	t.Parallel()
	if _, err := New(&job.RedactPolicy{Mode: "loud"}); err == nil {
		t.Fatal("mode loud accepted")
	}
}
