// How requests are retried on 429, 502-504 and network errors.

/** Defaults of RetryPolicy. */
export const retryDefaults = Object.freeze({
  maxAttempts: 8, // tries of one request, the first included
  initialBackoffMs: 200,
  maxBackoffMs: 10_000,
  multiplier: 2,
  maxElapsedMs: 60_000, // no retry starts after this long
});

/** No retries at all. */
export const NO_RETRY = Object.freeze({ ...retryDefaults, maxAttempts: 1 });

/**
 * The wait before retry n (0-based): a random time between half and all of
 * min(maxBackoffMs, initialBackoffMs * multiplier^n), so clients that failed
 * together do not come back together; never less than the server's
 * Retry-After (seconds).
 */
export function backoffMs(policy, n, retryAfter) {
  const ceiling = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * policy.multiplier ** n);
  let d = ceiling / 2 + Math.random() * (ceiling / 2);
  if (retryAfter !== undefined && retryAfter * 1000 > d) {
    d = retryAfter * 1000 + Math.random() * Math.min(1000, retryAfter * 100);
  }
  return d;
}

/** Resolves after ms, or rejects when signal aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
