package mcpserver

import (
	"context"
	"strconv"
	"sync"
)

// A tool call over streamable HTTP is answered on the response of the POST
// that carried it, and nowhere else: the server keeps no event store, so a
// client cannot resume a stream it dropped. A call whose answer can no
// longer be delivered is given up, and its job canceled, as a
// notifications/cancelled would: when the client deletes its session
// (calls), and when the POST's request ends before the answer (posts; the
// SDK would let the call, and its job, run on). Over stdio a call ends with
// its connection (the SDK cancels its context).

// calls are the running tool calls of each streamable HTTP session.
type calls struct {
	mu   sync.Mutex
	next uint64
	by   map[string]map[uint64]context.CancelFunc
}

// add registers a call of session id; the returned func removes it.
func (c *calls) add(id string, cancel context.CancelFunc) (remove func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]map[uint64]context.CancelFunc{}
	}
	if c.by[id] == nil {
		c.by[id] = map[uint64]context.CancelFunc{}
	}
	c.next++
	n := c.next
	c.by[id][n] = cancel
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.by[id], n)
		if len(c.by[id]) == 0 {
			delete(c.by, id)
		}
	}
}

// cancelSession cancels every running call of session id.
func (c *calls) cancelSession(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.by[id] {
		cancel()
	}
}

// postHeader carries, to the tool handlers (in the request's Extra.Header),
// the tag HTTPHandler gives each POST it serves. It is set by the server,
// over whatever a client sent.
const postHeader = "Kiln-Mcp-Post"

// posts are the POST requests being served, by tag, each with its
// request's context (done when the client goes away).
type posts struct {
	mu   sync.Mutex
	next uint64
	by   map[string]context.Context
}

// open registers a POST's request context under a new tag; done removes it
// once the request has been served.
func (p *posts) open(ctx context.Context) (tag string, done func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.by == nil {
		p.by = map[string]context.Context{}
	}
	p.next++
	tag = strconv.FormatUint(p.next, 10)
	p.by[tag] = ctx
	return tag, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.by, tag)
	}
}

// follow cancels a call once the POST tagged tag ends before the call
// does; the returned func stops following. A tag whose POST has already
// been served (the client went away before the call began) cancels it at
// once. An empty tag (stdio, or an in-memory transport) follows nothing.
func (p *posts) follow(tag string, cancel context.CancelFunc) (stop func()) {
	if tag == "" {
		return func() {}
	}
	p.mu.Lock()
	ctx, ok := p.by[tag]
	p.mu.Unlock()
	if !ok {
		cancel()
		return func() {}
	}
	after := context.AfterFunc(ctx, cancel)
	return func() { after() }
}
