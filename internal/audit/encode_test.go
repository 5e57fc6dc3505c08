package audit

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
)

// Every field of a record survives appendRecord as encoding/json would
// read it back; a field added to job.AuditRecord but not to appendRecord
// fails here, since the test record sets every field.
func TestAppendRecordKeepsEveryField(t *testing.T) {
	code := 3
	weird := "a\"b\\c\n\r\t\x00\x1f\x7f<&>\u2028\u2029é\xff\xfe😀 end"
	full := job.AuditRecord{
		Time: time.Date(2026, 11, 25, 4, 58, 1, 123456789, time.UTC), Kind: job.AuditSubmission, Key: "sha256:0011",
		JobID: "j1", SessionID: "s1", Call: 7, Runtime: "python", Digest: "sha256:dd", CodeSHA256: "cc",
		Inputs: map[string]string{"stdin": "11", "file:" + weird: "22"}, CacheHit: true, ReplayOf: "j0", Budget: "b1",
		Status: job.StatusSucceeded, ExitCode: &code, Outputs: map[string]string{"stdout": "33", "artifact:x": "44"}, Detail: weird,
		Egress: &job.EgressRecord{Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600)), Method: "CONNECT", Host: "example.org",
			Port: 443, Addr: "192.0.2.1:443", Allowed: true, Reason: "r", BytesUp: 1, BytesDown: 2, DurationMS: 3},
		Count: 60697,
	}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; name != "Seq" && v.Field(i).IsZero() {
			t.Fatalf("the test record leaves %s unset: set it, and encode it in appendRecord", name)
		}
	}
	zero := 0
	for _, rec := range []job.AuditRecord{full, {Time: full.Time, Kind: job.AuditCancel, ExitCode: &zero}, {Kind: job.AuditResult, Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("y", -7200))}} {
		b, err := appendRecord(nil, rec)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(rec)
		var got, exp job.AuditRecord
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if err := json.Unmarshal(want, &exp); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, exp) {
			t.Fatalf("read back:\n got %+v\nwant %+v\n(%s)", got, exp, b)
		}
	}
	if _, err := appendRecord(nil, job.AuditRecord{Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}); err == nil {
		t.Fatal("a year past 9999 was encoded")
	}
}

// Any string reads back as encoding/json's encoding of it reads back.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "\"\\\n\x00\x1f", "\xff\xfe", "\u2028\u2029", "é😀", "a\xc3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got, want string
		b := appendString(nil, s)
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q → %s: %v", s, b, err)
		}
		w, _ := json.Marshal(s)
		_ = json.Unmarshal(w, &want)
		if got != want {
			t.Fatalf("%q: read back %q, encoding/json's %q", s, got, want)
		}
	})
}
