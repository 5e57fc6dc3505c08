// Errors the Kiln client throws, mapped from the API's RFC 9457 problem types.
// Branch on the class (`err instanceof QueueFull`) or on err.type / err.field,
// never on the message text. The tables that pick the class are generated from
// the API's OpenAPI document (schema.js).

import { ERROR_CLASS_BY_STATUS, ERROR_CLASS_BY_TYPE, PROBLEM_PREFIX } from "./schema.js";

export { PROBLEM_PREFIX };

export class KilnError extends Error {
  constructor(message, { status = 0, type = "", title = "", detail = "", field = "", limit, retryAfter, problem, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.status = status;
    this.type = type;
    this.title = title;
    this.detail = detail;
    this.field = field;
    this.limit = limit;
    this.retryAfter = retryAfter; // seconds, when the server sent Retry-After
    this.problem = problem ?? {};
  }

  /** True when the same request may succeed later unchanged (429, 502-504, network). */
  get temporary() {
    return false;
  }
}

/** 400/413/415/422: the request is wrong; `field` names what to fix. */
export class InvalidRequest extends KilnError {}
/** 413: the request body is over the server's limit (`limit` bytes). */
export class PayloadTooLarge extends InvalidRequest {}
/** 401: no API key, or not a valid one. */
export class Unauthorized extends KilnError {}
/** 404: no such job (or artifact, or endpoint). */
export class NotFound extends KilnError {}
/** 405: the path exists for other methods. */
export class MethodNotAllowed extends KilnError {}
/** The Idempotency-Key was used before with a different request body. */
export class Conflict extends KilnError {}
/** 409: the budget the job names cannot cover it; retrying will not help. */
export class BudgetExhausted extends KilnError {}
/** 422: the job's network names a host the API key does not allow (or the key
 * allows no network); `field` is network.allow[i]. Retrying will not help. */
export class EgressNotAllowed extends InvalidRequest {}
/** 429: try again after `retryAfter` seconds. */
export class RateLimited extends KilnError {
  get temporary() {
    return true;
  }
}
/** 429: the job queue is at its limit; nothing was queued. */
export class QueueFull extends RateLimited {}
/** 429: one of the API key's quotas refuses the request (`type` names which:
 * quota-exceeded:max_queued, :submissions_per_second, :cpu_seconds_per_day,
 * :sessions; `limit` is the quota). A retry helps only after `retryAfter`
 * seconds, when the server sent one. */
export class QuotaExceeded extends RateLimited {
  get temporary() {
    return this.retryAfter !== undefined;
  }
}
/** 413 within a list answer: the job was left out to keep the answer within
 * the server's bound (`limit` bytes); read it on its own. */
export class ResponseTooLarge extends KilnError {}
/** 409: the job cannot be replayed as it ran (its inputs or its image are gone). */
export class ReplayUnavailable extends KilnError {}
/** 410: the session has ended (deleted, idle, past its lifetime); make a new one. */
export class SessionEnded extends KilnError {}
/** 409: the session's files make the file operation impossible: something
 * already there, a file where a directory is needed, a directory not empty, a
 * symbolic link in the way, or /work at its bound. `title` and `detail` say
 * which, `field` names the path at fault (path or to). Retrying as it is will
 * not help. */
export class FileConflict extends KilnError {}
/** 503: a dependency of the API (queue, job store) is down; nothing was changed. */
export class Unavailable extends KilnError {
  get temporary() {
    return true;
  }
}
/** 500 and other 5xx answers; 502-504 are temporary. */
export class ServerError extends KilnError {
  get temporary() {
    return this.status === 502 || this.status === 503 || this.status === 504;
  }
}
/** The API could not be reached, or the connection broke before an answer. */
export class ConnectionFailed extends KilnError {
  constructor(message, opts = {}) {
    super(message, opts);
    /** False when the request surely never reached the server (connection refused). */
    this.sent = opts.sent ?? true;
  }
  get temporary() {
    return true;
  }
}
/** The job did not finish before the deadline given to wait(); `job` is its last state. */
export class WaitTimeout extends KilnError {
  constructor(message, job) {
    super(message);
    this.job = job;
  }
}
/** A downloaded artifact's SHA-256 is not the one the server listed. */
export class IntegrityError extends KilnError {}

/** An answer the client could not decode (not JSON, or too deeply nested for the parser). */
export class DecodeError extends KilnError {}

const classes = {
  InvalidRequest, PayloadTooLarge, Unauthorized, NotFound, MethodNotAllowed, Conflict, BudgetExhausted, EgressNotAllowed,
  RateLimited, QueueFull, QuotaExceeded, Unavailable, ServerError, ResponseTooLarge, ReplayUnavailable, SessionEnded, FileConflict,
};
const byType = Object.fromEntries(Object.entries(ERROR_CLASS_BY_TYPE).map(([t, name]) => [t, classes[name]]));
const byStatus = Object.fromEntries(Object.entries(ERROR_CLASS_BY_STATUS).map(([st, name]) => [st, classes[name]]));

/** The error class for an answer: by problem type first, then by HTTP status. */
export function errorClass(status, problemType = "") {
  if (problemType.startsWith(PROBLEM_PREFIX)) {
    const cls = byType[problemType.slice(PROBLEM_PREFIX.length)];
    if (cls) return cls;
  }
  if (byStatus[status]) return byStatus[status];
  if (status >= 500) return ServerError;
  if (status >= 400) return InvalidRequest;
  return KilnError;
}

/** The error for a non-2xx answer whose body was `problem` (may be {}). */
export function fromProblem(status, problem, retryAfter) {
  const p = problem && typeof problem === "object" ? problem : {};
  const type = String(p.type ?? "");
  const title = String(p.title ?? "");
  const detail = String(p.detail ?? "");
  const field = String(p.field ?? "");
  let msg = `kiln: ${status} ${title || "error"}`;
  if (detail) msg += `: ${detail}`;
  if (field) msg += ` (field ${field})`;
  const Cls = errorClass(status, type);
  return new Cls(msg, {
    status, type, title, detail, field,
    limit: typeof p.limit === "number" ? p.limit : undefined,
    retryAfter, problem: p,
  });
}
