/*
 * Kiln's inner sandbox: what a box's zygote and the process it forks for a
 * job call to make that process the job's sandbox. One file per concern:
 *
 *   ns.c       namespaces: the job's fresh mount, uts, ipc, net (and pid)
 *              namespaces; the zygote's own user and pid namespaces
 *   mnt.c      mounts: /proc (hidepid, masked, read-only), /tmp, /dev/shm,
 *              mqueue, the job's /work, nothing of the box's /run/kiln
 *   net.c      network: loopback up, TCP buffer bounds, the egress listener
 *   user.c     credentials: the job's uid and gid, a user namespace of its
 *              own nested in the box's that maps that uid alone
 *   caps.c     capabilities: every set emptied, bounding and ambient too
 *   seccomp.c  no_new_privs and the job seccomp filter
 *   rlimits.c  rlimits and the OOM order
 *   jail.c     the order the steps run in, and errors
 *   arena.c    the zygote's own memory: its Python objects in one range
 *              huge pages can back (kj_py_arenas)
 *
 * The job's calls are made in a process forked from a preloaded
 * interpreter (deploy/images/python/box.py): no allocation, no thread, no
 * exec; only libc symbols every glibc has (raw syscalls for the rest), and,
 * weakly, CPython's arena allocator hooks (arena.c, which the zygote calls
 * once, before it preloads).
 *
 * A job's sandbox is made in three steps, each in the process that must
 * make it (a box job's forked process makes all three, kj_enter; a
 * session's steps run in three processes, deploy/images/python/session.py):
 *
 *   kj_unshare  as the box's root: fresh namespaces; the egress listener
 *   kj_mount    as the box's root, in the job's pid namespace: mounts,
 *               network, hostname, OOM order
 *   kj_become   the job's identity: its uid, its own user namespace, no
 *               capability, no_new_privs, the seccomp filter, rlimits
 *
 * Each returns NULL, or on failure job->err ("what: why").
 */
#ifndef KILN_JAIL_H
#define KILN_JAIL_H

#include <stddef.h>
#include <stdint.h>

/* KJ_ABI is the layout of struct kj_job; callers set job->abi to it. */
#define KJ_ABI 1

/* Where the box's own files are; nothing of them is in a job's view. */
#define KJ_BOX_DIR "/run/kiln"
/* The host-side dir of every job's work dir, made by the worker. */
#define KJ_JOBS_DIR KJ_BOX_DIR "/jobs"
/* The job's hostname. */
#define KJ_HOSTNAME "kiln"

struct kj_job {
	int32_t abi;         /* KJ_ABI */
	int32_t uid;         /* the job's uid and gid in the box's user namespace, > 0 */
	int32_t new_pid;     /* kj_unshare makes a pid namespace too (a session's init) */
	int32_t egress_port; /* > 0: listen on 127.0.0.1:egress_port in the job's network namespace ... */
	int32_t egress_fd;   /* ... and send the listener on this unix socket (SCM_RIGHTS) */
	int32_t proc_fd;     /* kj_mount's handle on a writable /proc, for kj_become; -1 */
	int32_t keep[4];     /* descriptors kj_become leaves open besides 0, 1, 2; -1: none */
	int64_t cpu_s;       /* RLIMIT_CPU, seconds (hard: one more); 0: none */
	int64_t fsize;       /* RLIMIT_FSIZE, bytes; 0: none */
	int64_t nofile;      /* RLIMIT_NOFILE; 0: none */
	int64_t tmp_mb;      /* the size of /tmp and of /dev/shm, MiB */
	const char *work;    /* the job's dir under KJ_JOBS_DIR, bound on /work */
	const char *rmem;    /* net.ipv4.tcp_rmem of the job's network namespace */
	const char *wmem;    /* net.ipv4.tcp_wmem */
	const char *masked;   /* ':'-separated paths of /proc masked in the job's /proc */
	const char *readonly; /* ':'-separated paths of /proc made read-only there */
	const void *filter;  /* the job seccomp filter: an array of struct sock_filter */
	int64_t filter_len;  /* its length in bytes */
	char err[256];       /* what failed */
};

/* The job's sandbox, all three steps (a box job's forked process). */
const char *kj_enter(struct kj_job *job);

const char *kj_unshare(struct kj_job *job);
const char *kj_mount(struct kj_job *job);
const char *kj_become(struct kj_job *job);

/*
 * The zygote's own namespaces (ns.c). Each returns 0, or -1 with errno set.
 *
 * kj_box_userns: the zygote makes the box's user namespace (owned by the
 * box's host uid; the worker then writes its maps) and makes itself
 * non-dumpable.
 * kj_box_root: once mapped, the zygote becomes the box's root and makes a
 * pid namespace of the box's own for its next child (the zygote proper).
 * kj_job_pidns: the zygote's next children (a job's reaper and process)
 * are members of a fresh pid namespace.
 * kj_box_pidns: they are members of the box's own again (fd: the box's
 * pid namespace, /proc/self/ns/pid opened by the zygote).
 */
int kj_box_userns(void);
int kj_box_root(void);
int kj_job_pidns(void);
int kj_box_pidns(int fd);

/*
 * kj_py_arenas (arena.c): the calling Python interpreter takes its object
 * arenas from one range of reserve bytes (a multiple of 2 MiB) reserved
 * and aligned to 2 MiB, so huge pages can back them; arenas past it come
 * from CPython's own allocator as before. Called once, before preloading.
 * Returns 0, or -1 with errno set (ENOSYS: not in a Python process;
 * EINVAL: a second call or a bad size).
 */
int kj_py_arenas(size_t reserve);

#endif
