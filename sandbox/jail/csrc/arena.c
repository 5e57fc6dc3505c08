/*
 * Where the zygote's Python objects live. CPython's small-object allocator
 * takes its arenas (1 MiB) from mmap one at a time, so a preloaded
 * interpreter's objects lie in hundreds of small mappings between the
 * shared libraries' own, and no huge page can back them: a huge page needs
 * 2 MiB, aligned, of one mapping. kj_py_arenas has it take them from one
 * range reserved for them, aligned to 2 MiB, instead: the zygote's
 * huge_pages() (deploy/images/python/box.py) then backs them with huge
 * pages, and each job's fork copies one page-table entry for every 2 MiB of
 * them instead of 512, and its exit frees as few.
 *
 * Called in the launcher before it preloads: arenas allocated before then
 * stay where they are and go back to CPython's own allocator when freed,
 * as do arenas of another size and those past the range (a process that
 * holds more objects than the range does not fail for it).
 *
 * The range is reserved, not committed: an arena's pages are the kernel's
 * zero pages until written, and a freed arena's pages are given back
 * (MADV_DONTNEED) before it is handed out again. CPython calls the
 * allocator with its lock (the GIL) held, so it keeps no lock of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "internal.h"

/* CPython's PyObjectArenaAllocator (Include/cpython/objimpl.h), a stable
 * layout since Python 3.4. */
struct py_arena_allocator {
	void *ctx;
	void *(*alloc)(void *ctx, size_t size);
	void (*free)(void *ctx, void *ptr, size_t size);
};

/* Weak: the library is loaded into Python processes only, but links
 * against libc alone (and its C tests are not Python). */
extern void PyObject_GetArenaAllocator(struct py_arena_allocator *a) __attribute__((weak));
extern void PyObject_SetArenaAllocator(struct py_arena_allocator *a) __attribute__((weak));

#define HUGE_PAGE (2UL << 20)
/* The arenas the range holds at most: what its free list tracks. */
#define MAX_ARENAS 4096

static struct {
	char *base, *next, *end;
	size_t size; /* the arenas' size, the first one asked for */
	void *freed[MAX_ARENAS];
	int nfreed;
	struct py_arena_allocator prev;
} ar;

static int in_range(const void *p)
{
	return (const char *)p >= ar.base && (const char *)p < ar.end;
}

static void *arena_alloc(void *ctx, size_t size)
{
	(void)ctx;
	if (ar.size == 0) {
		/* The range holds no more arenas than the free list tracks. */
		ar.size = size;
		if ((size_t)(ar.end - ar.base) / size > MAX_ARENAS)
			ar.end = ar.base + (size_t)MAX_ARENAS * size;
	}
	if (size == ar.size) {
		if (ar.nfreed > 0)
			return ar.freed[--ar.nfreed];
		if ((size_t)(ar.end - ar.next) >= size) {
			void *p = ar.next;
			ar.next += size;
			return p;
		}
	}
	return ar.prev.alloc(ar.prev.ctx, size);
}

static void arena_free(void *ctx, void *p, size_t size)
{
	(void)ctx;
	if (!in_range(p)) {
		ar.prev.free(ar.prev.ctx, p, size);
		return;
	}
	/* Its pages back to the kernel; the range stays the arenas'. The free
	 * list has room for every arena of the range. */
	madvise(p, size, MADV_DONTNEED);
	ar.freed[ar.nfreed++] = p;
}

KJ_API int kj_py_arenas(size_t reserve)
{
	if (!PyObject_GetArenaAllocator || !PyObject_SetArenaAllocator) {
		errno = ENOSYS;
		return -1;
	}
	if (ar.base != NULL || reserve == 0 || reserve % HUGE_PAGE != 0) {
		errno = EINVAL;
		return -1;
	}
	char *m = mmap(NULL, reserve + HUGE_PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -1;
	/* Aligned to 2 MiB; the rest of the reservation is given back. */
	char *base = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
	if (base > m)
		munmap(m, (size_t)(base - m));
	munmap(base + reserve, (size_t)(m + HUGE_PAGE - base));
	ar.base = ar.next = base;
	ar.end = base + reserve;
	PyObject_GetArenaAllocator(&ar.prev);
	struct py_arena_allocator mine = {NULL, arena_alloc, arena_free};
	PyObject_SetArenaAllocator(&mine);
	return 0;
}
