package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Event is one Server-Sent Event of GET /v1/jobs/{id}/events.
type Event struct {
	// ID resumes the stream after this event (pass it as lastEventID).
	ID string
	// Type is job.EventStatus, EventStdout, EventStderr,
	// EventOutputSkipped (job.SkippedEvent: output the live view left out
	// here), EventOutput, EventArtifacts or EventResult (whose Data is the
	// job's JobView; the stream ends after it).
	Type string
	// Data is the event's JSON.
	Data json.RawMessage
}

// openStream sends an authenticated GET and returns the response when it
// is a 2xx, else the API's problem as *Error.
func (c *Client) openStream(ctx context.Context, path string, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("kiln client: GET %s: %w", path, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kiln client: GET %s: %w", path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, errorFromResponse(resp, raw)
	}
	return resp, nil
}

// Events follows a job's event stream, calling fn for each event until the
// result event (then it returns nil), fn's error, or the stream breaks (an
// error: reconnect with the last event's ID). lastEventID "" starts from
// the first retained event.
func (c *Client) Events(ctx context.Context, id, lastEventID string, fn func(Event) error) error {
	hdr := http.Header{"Accept": {"text/event-stream"}}
	if lastEventID != "" {
		hdr.Set("Last-Event-ID", lastEventID)
	}
	resp, err := c.openStream(ctx, jobPath(id)+"/events", hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var ev Event
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch {
		case line == "":
			if ev.Type != "" {
				ev.Data = json.RawMessage(data.String())
				if err := fn(ev); err != nil {
					return err
				}
				if ev.Type == "result" {
					return nil
				}
			}
			ev, data = Event{}, strings.Builder{}
		case field == "id":
			ev.ID = value
		case field == "event":
			ev.Type = value
		case field == "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(value)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("kiln client: events of %s: %w", id, err)
	}
	return fmt.Errorf("kiln client: events of %s: %w", id, io.ErrUnexpectedEOF)
}

// Artifact opens the content of a finished job's artifact; close it.
func (c *Client) Artifact(ctx context.Context, id, name string) (io.ReadCloser, error) {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	resp, err := c.openStream(ctx, jobPath(id)+"/artifacts/"+strings.Join(parts, "/"), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
