// Package box is the box source: which box a job gets, and when boxes are
// made and retired. It holds the neutral boxes of each class (Config.Neutral
// kept ready or being made) and every tenant's idle boxes; Take gives a
// job its tenant's idle box of its class, else a neutral box (which becomes
// the tenant's), else nothing; Await waits for one (Config.Wait); Put
// returns a box that served a job cleanly. At the bound (Config.Max) the
// least recently used idle box of any tenant is retired to make room; a
// box older than Config.MaxAge, or whose task ended while idle, is retired
// when a job would take it; after a failed creation no box of that class
// is tried for RetryAfter.
//
// Seam: a Source is generic over the box (Box: when it was ready and last
// used, whether it ended, Claim), the class (Class) and the image, and
// makes and ends boxes through a Maker (package sandbox's, on containerd).
// It judges time by Config.Now, so its decisions are unit-tested with a
// fake maker on a manual clock. It never imports package sandbox.
//
// Invariants: a box of one tenant never serves another (a neutral box is
// claimed by its first job's tenant); a box is in at most one place (idle,
// neutral, or handed out); there are never more than Config.Max boxes,
// busy ones and those being made included; after Stop no box is kept or
// made, and each one being made is ended once made.
package box
