package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

func TestKeyFileRedactionSettings(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "keys")
	line := " redact=strict redact_secret=vault-passphrase-1 redact_pattern=emp:EMP-[0-9]{6}\n"
	content := "alice:k-a1" + line + "alice:k-a2" + line + "bob:k-bob redact=off\ncarol:k-carol\n"
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	_, tenants, err := loadAPIKeys(file, "")
	if err != nil {
		t.Fatal(err)
	}
	p := tenants["alice"].Redact
	fp, _ := redact.Fingerprint("vault-passphrase-1")
	if p == nil || p.Mode != job.RedactStrict || len(p.Secrets) != 1 || p.Secrets[0] != fp ||
		len(p.Patterns) != 1 || p.Patterns[0] != (job.RedactPattern{Name: "emp", Regexp: "EMP-[0-9]{6}"}) {
		t.Fatalf("alice's policy %+v", p)
	}
	if strings.Contains(strings.ToLower(fmtPolicy(p)), "vault-passphrase") {
		t.Fatal("the secret itself is in the policy sent to workers")
	}
	if tenants["bob"].Redact.Mode != job.RedactOff || tenants["carol"].Redact != nil {
		t.Fatalf("bob %+v carol %+v", tenants["bob"].Redact, tenants["carol"].Redact)
	}
	for _, bad := range []string{
		"alice:k1 redact=loud",
		"alice:k1 redact_secret=short",
		"alice:k1 redact_pattern=nocolon",
		"alice:k1 redact_pattern=x:a*",
		"alice:k1 redact_pattern=x:(",
	} {
		if err := os.WriteFile(file, []byte(bad+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := loadAPIKeys(file, ""); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func fmtPolicy(p *job.RedactPolicy) string {
	var b strings.Builder
	for _, s := range p.Secrets {
		b.WriteString(s.SHA256)
	}
	for _, x := range p.Patterns {
		b.WriteString(x.Regexp)
	}
	return b.String()
}
