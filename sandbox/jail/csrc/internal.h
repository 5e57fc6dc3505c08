/* What the concern files of the jail share; not part of its API. */
#ifndef KILN_JAIL_INTERNAL_H
#define KILN_JAIL_INTERNAL_H

#include "jail.h"

#define KJ_API __attribute__((visibility("default")))

/* kj_fail formats "what: strerror(errno)" into job->err and returns -1;
 * kj_failx the same without errno. */
int kj_fail(struct kj_job *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int kj_failx(struct kj_job *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* kj_write_at writes data to path (relative to dirfd, or absolute) in one
 * write, as /proc and /proc/sys files want it. */
int kj_write_at(struct kj_job *job, int dirfd, const char *path, const char *data);

/* ns.c */
int ns_unshare_job(struct kj_job *job);
int ns_hostname(struct kj_job *job);

/* mnt.c */
int mnt_job(struct kj_job *job);

/* net.c */
int net_loopback_up(struct kj_job *job);
int net_tcp_buffers(struct kj_job *job);
int net_egress(struct kj_job *job);

/* user.c */
int user_drop(struct kj_job *job);
int user_own_ns(struct kj_job *job);

/* caps.c */
int caps_drop_all(struct kj_job *job);

/* seccomp.c */
int seccomp_install(struct kj_job *job);

/* rlimits.c */
int rlimits_oom_order(struct kj_job *job);
int rlimits_set(struct kj_job *job);

#endif
