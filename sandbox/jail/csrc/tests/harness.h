/*
 * The jail's unit tests: each concern's test program runs its cases, each
 * in a process made as a box's job process is made, and checks the step's
 * effect from inside. Run as the host's root by package jail's Go test.
 *
 * A case runs in a "box": a child in a user namespace of its own (root
 * inside is host uid TEST_BOX_BASE, 65536 uids mapped, as the worker maps
 * a box's), a mount namespace whose root is a small tmpfs (/proc and /dev
 * bound from the host's, /tmp, /work, /run/kiln/jobs/<work>), root in it;
 * then, as a box's zygote does, a fresh pid namespace for its next child,
 * the case's process, which starts as the box's root with every
 * capability in the box's namespace.
 */
#ifndef KILN_JAIL_HARNESS_H
#define KILN_JAIL_HARNESS_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../jail.h"

/* Host uid of the test box's root: far from every range a worker uses. */
#define TEST_BOX_BASE 3221225472U
#define TEST_UID 4242
#define TEST_WORK "j1"

/* CHECK fails the case with a message when cond is false. */
#define CHECK(cond, ...)                                                                 \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "    %s:%d: ", __FILE__, __LINE__);                \
			fprintf(stderr, __VA_ARGS__);                                    \
			fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));     \
			return 1;                                                        \
		}                                                                        \
	} while (0)

/* CHECK_OK fails the case when a jail call returned an error. */
#define CHECK_OK(call)                                                                   \
	do {                                                                             \
		const char *err_ = (call);                                               \
		CHECK(err_ == NULL, "%s: %s", #call, err_);                              \
	} while (0)

/* test_job is a job as the worker would describe one, with a filter that
 * allows everything (the seccomp test installs the real one). */
struct kj_job test_job(void);

/* run_case runs fn in a fresh box's job process and prints "ok NAME" or
 * "FAIL NAME"; it returns 0 when the case passed. */
int run_case(const char *name, int (*fn)(void));

/* read_file reads at most n-1 bytes of path into buf (NUL-terminated);
 * -1 on error. */
int read_file(const char *path, char *buf, size_t n);

/* status_field returns the value of a /proc/self/status line ("CapEff")
 * in buf, or "" when there is none. */
const char *status_field(const char *field, char *buf, size_t n);

/* ns_id is the inode of /proc/self/ns/<name> (0 on error). */
unsigned long ns_id(const char *name);

#endif
