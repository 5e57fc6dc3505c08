// The API's enums and error tables, from its OpenAPI document.
// Generated from producer/openapi.json by internal/sdkgen (make sdk); do not edit.
// Types: schema.d.ts; the wire types: openapi.d.ts.

export const PROBLEM_PREFIX = "urn:kiln:problem:";
export const STATUSES = Object.freeze(["queued", "running", "succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error"]);
export const PENDING_STATUSES = Object.freeze(["queued", "running"]);
export const TERMINAL_STATUSES = Object.freeze(["succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error"]);
export const CATEGORIES = Object.freeze(["syntax_error", "runtime_error", "timeout", "memory_limit", "output_limit", "forbidden", "invalid_request", "canceled", "internal", "quota_exceeded"]);
export const PROBLEM_TYPES = Object.freeze(["urn:kiln:problem:malformed-json", "urn:kiln:problem:unknown-field", "urn:kiln:problem:unsupported-media-type", "urn:kiln:problem:body-too-large", "urn:kiln:problem:invalid-field", "urn:kiln:problem:batch-too-large", "urn:kiln:problem:invalid-parameter", "urn:kiln:problem:invalid-id", "urn:kiln:problem:not-found", "urn:kiln:problem:method-not-allowed", "urn:kiln:problem:idempotency-key-reused", "urn:kiln:problem:unauthorized", "urn:kiln:problem:queue-full", "urn:kiln:problem:unavailable", "urn:kiln:problem:internal", "urn:kiln:problem:duplicate-field", "urn:kiln:problem:field-name-case", "urn:kiln:problem:busy", "urn:kiln:problem:quota-exceeded:max_queued", "urn:kiln:problem:quota-exceeded:submissions_per_second", "urn:kiln:problem:quota-exceeded:cpu_seconds_per_day", "urn:kiln:problem:response-too-large", "urn:kiln:problem:budget-exhausted", "urn:kiln:problem:replay-unavailable", "urn:kiln:problem:session-ended", "urn:kiln:problem:quota-exceeded:sessions", "urn:kiln:problem:quota-exceeded:session_memory", "urn:kiln:problem:egress-not-allowed", "urn:kiln:problem:file-conflict", "urn:kiln:problem:stdin-closed"]);
export const TOOL_FORMATS = Object.freeze(["anthropic", "openai", "openai-responses"]);

/** The error class (errors.js) of each problem type, by the part after PROBLEM_PREFIX. */
export const ERROR_CLASS_BY_TYPE = Object.freeze({
  "malformed-json": "InvalidRequest",
  "unknown-field": "InvalidRequest",
  "unsupported-media-type": "InvalidRequest",
  "body-too-large": "PayloadTooLarge",
  "invalid-field": "InvalidRequest",
  "batch-too-large": "InvalidRequest",
  "invalid-parameter": "InvalidRequest",
  "invalid-id": "InvalidRequest",
  "not-found": "NotFound",
  "method-not-allowed": "MethodNotAllowed",
  "idempotency-key-reused": "Conflict",
  "unauthorized": "Unauthorized",
  "queue-full": "QueueFull",
  "unavailable": "Unavailable",
  "internal": "ServerError",
  "duplicate-field": "InvalidRequest",
  "field-name-case": "InvalidRequest",
  "busy": "Unavailable",
  "quota-exceeded:max_queued": "QuotaExceeded",
  "quota-exceeded:submissions_per_second": "QuotaExceeded",
  "quota-exceeded:cpu_seconds_per_day": "QuotaExceeded",
  "response-too-large": "ResponseTooLarge",
  "budget-exhausted": "BudgetExhausted",
  "replay-unavailable": "ReplayUnavailable",
  "session-ended": "SessionEnded",
  "quota-exceeded:sessions": "QuotaExceeded",
  "quota-exceeded:session_memory": "QuotaExceeded",
  "egress-not-allowed": "EgressNotAllowed",
  "file-conflict": "FileConflict",
  "stdin-closed": "Conflict",
});

/** The error class of an answer of no known problem type, by its HTTP status. */
export const ERROR_CLASS_BY_STATUS = Object.freeze({
  400: "InvalidRequest",
  401: "Unauthorized",
  403: "Unauthorized",
  404: "NotFound",
  405: "MethodNotAllowed",
  409: "Conflict",
  410: "SessionEnded",
  413: "PayloadTooLarge",
  415: "InvalidRequest",
  422: "InvalidRequest",
  429: "RateLimited",
  503: "Unavailable",
});

export const ERROR_CLASSES = Object.freeze(["BudgetExhausted", "Conflict", "EgressNotAllowed", "FileConflict", "InvalidRequest", "MethodNotAllowed", "NotFound", "PayloadTooLarge", "QueueFull", "QuotaExceeded", "RateLimited", "ReplayUnavailable", "ResponseTooLarge", "ServerError", "SessionEnded", "Unauthorized", "Unavailable"]);
