// Declarations of schema.js.
// Generated from producer/openapi.json by internal/sdkgen (make sdk); do not edit.

export declare const PROBLEM_PREFIX: "urn:kiln:problem:";
export declare const STATUSES: readonly ["queued", "running", "succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error"];
export declare const PENDING_STATUSES: readonly ["queued", "running"];
export declare const TERMINAL_STATUSES: readonly ["succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error"];
export declare const CATEGORIES: readonly ["syntax_error", "runtime_error", "timeout", "memory_limit", "output_limit", "forbidden", "invalid_request", "canceled", "internal", "quota_exceeded"];
export declare const PROBLEM_TYPES: readonly ["urn:kiln:problem:malformed-json", "urn:kiln:problem:unknown-field", "urn:kiln:problem:unsupported-media-type", "urn:kiln:problem:body-too-large", "urn:kiln:problem:invalid-field", "urn:kiln:problem:batch-too-large", "urn:kiln:problem:invalid-parameter", "urn:kiln:problem:invalid-id", "urn:kiln:problem:not-found", "urn:kiln:problem:method-not-allowed", "urn:kiln:problem:idempotency-key-reused", "urn:kiln:problem:unauthorized", "urn:kiln:problem:queue-full", "urn:kiln:problem:unavailable", "urn:kiln:problem:internal", "urn:kiln:problem:duplicate-field", "urn:kiln:problem:field-name-case", "urn:kiln:problem:busy", "urn:kiln:problem:quota-exceeded:max_queued", "urn:kiln:problem:quota-exceeded:submissions_per_second", "urn:kiln:problem:quota-exceeded:cpu_seconds_per_day", "urn:kiln:problem:response-too-large", "urn:kiln:problem:budget-exhausted", "urn:kiln:problem:replay-unavailable", "urn:kiln:problem:session-ended", "urn:kiln:problem:quota-exceeded:sessions", "urn:kiln:problem:quota-exceeded:session_memory", "urn:kiln:problem:egress-not-allowed", "urn:kiln:problem:file-conflict", "urn:kiln:problem:stdin-closed"];
export declare const TOOL_FORMATS: readonly ["anthropic", "openai", "openai-responses"];
export type ErrorClassName = "BudgetExhausted" | "Conflict" | "EgressNotAllowed" | "FileConflict" | "InvalidRequest" | "MethodNotAllowed" | "NotFound" | "PayloadTooLarge" | "QueueFull" | "QuotaExceeded" | "RateLimited" | "ReplayUnavailable" | "ResponseTooLarge" | "ServerError" | "SessionEnded" | "Unauthorized" | "Unavailable";
export declare const ERROR_CLASS_BY_TYPE: Readonly<Record<string, ErrorClassName>>;
export declare const ERROR_CLASS_BY_STATUS: Readonly<Record<number, ErrorClassName>>;
export declare const ERROR_CLASSES: readonly ErrorClassName[];
