package producer

import (
	"net/http"
	"testing"
)

// Issue 23, acceptance 6: /v1/tool-calls reads names as strictly as
// /v1/jobs, in every format's shape: a case variant or a repeated member,
// in the envelope or the input (OpenAI's arguments string included), is a
// 400 naming the field, with the problem type /v1/jobs answers, and runs
// nothing.
func TestToolCallStrictNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobsCase := b.submit(t, `{"CODE":"print(1)"}`).problem(t, http.StatusBadRequest)
	jobsDup := b.submit(t, `{"code":"print(1)","code":"print(2)"}`).problem(t, http.StatusBadRequest)
	for _, tc := range []struct {
		body, field, typ string
	}{
		{`{"type":"tool_use","id":"t","name":"run_python","Input":{"code":"print(1)"}}`, "Input", jobsCase.Type},
		{`{"type":"tool_use","id":"t","Name":"run_python","input":{"code":"print(1)"}}`, "Name", jobsCase.Type},
		{`{"type":"tool_use","id":"t","name":"run_python","input":{"CODE":"print(1)"}}`, "input.CODE", jobsCase.Type},
		{`{"type":"tool_use","id":"t","name":"run_python","input":{"code":"print(1)","code":"print(2)"}}`, "input.code", jobsDup.Type},
		{`{"type":"tool_use","id":"t","name":"run_python","name":"run_node","input":{"code":"1"}}`, "name", jobsDup.Type},
		{`{"type":"tool_use","id":"t","name":"run_python","input":{"code":"1","files":[{"name":"a","Content":"x"}]}}`, "input.files[0].Content", jobsCase.Type},
		{`{"id":"c","type":"function","function":{"name":"run_python","arguments":"{\"Code\":\"print(1)\"}"}}`, "function.arguments.Code", jobsCase.Type},
		{`{"id":"c","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"print(1)\",\"code\":\"print(2)\"}"}}`, "function.arguments.code", jobsDup.Type},
		{`{"id":"c","type":"function","function":{"name":"run_python","arguments":{"code":"1","CODE":"2"}}}`, "function.arguments.CODE", jobsCase.Type},
		{`{"id":"c","type":"function","function":{"Name":"run_python","arguments":"{}"}}`, "function.Name", jobsCase.Type},
		{`{"id":"c","type":"function","Function":{"name":"run_python","arguments":"{}"}}`, "Function", jobsCase.Type},
		{`{"id":"c","type":"function","function":{"name":"run_python","arguments":"{\"code\":\"1\"}","arguments":"{\"code\":\"2\"}"}}`, "function.arguments", jobsDup.Type},
		{`{"type":"function_call","call_id":"c","name":"run_python","arguments":"{\"Code\":\"print(1)\"}"}`, "arguments.Code", jobsCase.Type},
		{`{"type":"function_call","call_id":"c","name":"run_python","arguments":"{\"code\":\"1\",\"code\":\"2\"}"}`, "arguments.code", jobsDup.Type},
		{`{"type":"function_call","Call_id":"c","name":"run_python","arguments":"{}"}`, "Call_id", jobsCase.Type},
		{`{"type":"function_call","call_id":"c","call_id":"d","name":"run_python","arguments":"{}"}`, "call_id", jobsDup.Type},
		{`{"type":"function_call","call_id":"c","name":"run_python","arguments":{"code":"1","Stdin":"x"}}`, "arguments.Stdin", jobsCase.Type},
	} {
		p := toolCall(t, b, tc.body, nil).problem(t, http.StatusBadRequest)
		if p.Field != tc.field || p.Type != tc.typ {
			t.Errorf("%s: problem %s on %q, want %s on %q", tc.body, p.Type, p.Field, tc.typ, tc.field)
		}
	}
	if recs, _ := b.jobKeys(t); recs != 0 {
		t.Errorf("%d jobs recorded for refused calls", recs)
	}
	// Members neither vendor's shape names are still let through (answered
	// by the decoder as before), and a good call still runs.
	r := toolCall(t, b, `{"type":"tool_use","id":"t","name":"run_python","input":{"code":"print(1)"},"cache_control":{"type":"ephemeral"}}`, succeeded("1\n"))
	var res anthropicResult
	r.decode(t, &res)
	if r.StatusCode != http.StatusOK || res.IsError {
		t.Errorf("a good call with an extra member: %d %s", r.StatusCode, r.body)
	}
}
