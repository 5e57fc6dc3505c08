package trace

import "go.opentelemetry.io/otel/attribute"

// IsolationKey is the sandbox.create span's isolation: "runc" or "gvisor".
const IsolationKey = attribute.Key("kiln.sandbox.isolation")
