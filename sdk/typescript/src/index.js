// Kiln's TypeScript/JavaScript client. Types: index.d.ts next to this file.
export { Client, DEFAULT_SERVER, USER_AGENT, isTerminal, specBody } from "./client.js";
export {
  KilnError, InvalidRequest, PayloadTooLarge, Unauthorized, NotFound, MethodNotAllowed, Conflict, BudgetExhausted, EgressNotAllowed,
  RateLimited, QueueFull, QuotaExceeded, ResponseTooLarge, ReplayUnavailable, SessionEnded, FileConflict, Unavailable, ServerError,
  ConnectionFailed, WaitTimeout, IntegrityError, DecodeError,
  PROBLEM_PREFIX, errorClass, fromProblem,
} from "./errors.js";
export { NO_RETRY, retryDefaults, backoffMs } from "./retry.js";
export { parseSSE } from "./sse.js";
export { Session } from "./sessions.js";
export { STATUSES, PENDING_STATUSES, TERMINAL_STATUSES, CATEGORIES, PROBLEM_TYPES } from "./schema.js";
export * as tools from "./tools.js";
