package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadTenantsReadsCallbackSecrets(t *testing.T) {
	f := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(f, []byte("# comment\nacme:k1:whsec-acme\nacme:k2\nbeta:k3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, secrets, err := loadTenants(f, "gamma:k4:whsec-gamma")
	if err != nil {
		t.Fatal(err)
	}
	if keys["k1"] != "acme" || keys["k2"] != "acme" || keys["k3"] != "beta" || keys["k4"] != "gamma" || len(keys) != 4 {
		t.Errorf("keys %v", keys)
	}
	if string(secrets["acme"]) != "whsec-acme" || string(secrets["gamma"]) != "whsec-gamma" || len(secrets) != 2 {
		t.Errorf("secrets %q", secrets)
	}
	if err := os.WriteFile(f, []byte("acme:k1:s1\nacme:k2:s2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadTenants(f, ""); err == nil || !strings.Contains(err.Error(), "two different callback secrets") {
		t.Errorf("err = %v", err)
	}
}
