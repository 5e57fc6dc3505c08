package job

import (
	"errors"
	"strings"
	"testing"
)

func TestCommandRequestValidate(t *testing.T) {
	for _, tc := range []struct {
		req   CommandRequest
		field string
	}{
		{CommandRequest{Cmd: "ls -la"}, ""},
		{CommandRequest{Cmd: "sleep 5", Background: true, Env: map[string]string{"A": "1"}}, ""},
		{CommandRequest{}, "cmd"},
		{CommandRequest{Cmd: strings.Repeat("x", MaxCommandBytes+1)}, "cmd"},
		{CommandRequest{Cmd: "a\x00b"}, "cmd"},
		{CommandRequest{Cmd: "ls", TimeoutS: -1}, "timeout_s"},
		{CommandRequest{Cmd: "ls", TimeoutS: 5, Background: true}, "timeout_s"},
		{CommandRequest{Cmd: "ls", Env: map[string]string{"A=B": "1"}}, "env"},
		{CommandRequest{Cmd: "ls", Env: map[string]string{"A": "1\x00"}}, "env"},
	} {
		err := tc.req.Validate()
		var inv *InvalidError
		if tc.field == "" && err != nil || tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field) {
			t.Errorf("%+v: %v; want field %q", tc.req, err, tc.field)
		}
	}
	for id, ok := range map[string]bool{"1": true, "42": true, "0": false, "-1": false, "01": false, "x": false, "": false} {
		if ValidCommandID(id) != ok {
			t.Errorf("ValidCommandID(%q) = %v", id, !ok)
		}
	}
}
